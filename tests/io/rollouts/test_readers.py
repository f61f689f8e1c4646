"""Reading rollout files (otb_diag/io/rollouts/readers.py): JSONL and Parquet, aliases, verl
dumps, and a round-trip property."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from rollout_files import (
    char_tokenizer,
    good_row,
    read_error,
    text_row,
    write_jsonl,
    write_parquet,
)

from otb_diag.io.loading import group_rows, load_rollouts
from otb_diag.io.rollouts.readers import TOKEN_FIELDS, Response
from otb_diag.io.rollouts.to_batch import make_batch
from otb_diag.io.rollouts.tokenize import tokenize_rollouts

# --- good input -----------------------------------------------------------------------------


def test_jsonl_and_parquet_read_the_same_responses(tmp_path: Path) -> None:
    rows = [good_row(), good_row(group="h"), text_row()]
    from_jsonl = load_rollouts(write_jsonl(tmp_path / "r.jsonl", rows))
    from_parquet = load_rollouts(write_parquet(tmp_path / "r.parquet", rows))
    assert (from_jsonl.format, from_parquet.format) == ("jsonl", "parquet")
    assert [r.source_row for r in from_jsonl.responses] == [1, 2, 3]
    assert [r.source_row for r in from_parquet.responses] == [0, 1, 2]
    first = from_jsonl.responses[0]
    assert first == Response(
        group="g",
        sample=0,
        source_row=1,
        prompt="ab",
        response="cab",
        prompt_ids=[1, 2],
        response_ids=[3, 1, 2],
        reward=1.0,
        token_rewards=[0.0, 0.0, 1.0],
        mask=[1, 0, 1],
        step=7,
        logprobs=[-1.0, -1.2, -1.5],
        sum_pi2=[0.5, 0.6, 0.7],
        is_weights=[1.0, 0.9, 1.1],
        temperature=0.8,
    )
    unplaced = [dataclasses.replace(r, source_row=0) for r in from_jsonl.responses]
    assert unplaced == [dataclasses.replace(r, source_row=0) for r in from_parquet.responses]


def test_boolean_mask_reads_as_0_and_1(tmp_path: Path) -> None:
    path = write_parquet(tmp_path / "r.parquet", [good_row(mask=[True, False, True])])
    assert load_rollouts(path).responses[0].mask == [1, 0, 1]


def test_json_suffix_reads_as_json_lines(tmp_path: Path) -> None:
    assert load_rollouts(write_jsonl(tmp_path / "r.json", [text_row()])).format == "jsonl"


def test_unicode_line_separators_inside_strings_do_not_split_lines(tmp_path: Path) -> None:
    text = "a\u2028b\x85c\rd"  # str.splitlines() would break the line at each of these
    path = write_jsonl(tmp_path / "r.jsonl", [text_row(response=text), text_row()])
    assert [r.response for r in load_rollouts(path).responses] == [text, "cab"]


def test_groups_and_samples_follow_file_order(tmp_path: Path) -> None:
    rows = [text_row(group="b"), text_row(group="a"), text_row(group="b"), text_row(group=7)]
    rollouts = load_rollouts(write_jsonl(tmp_path / "r.jsonl", rows))
    assert group_rows(rollouts.responses) == {"b": [0, 2], "a": [1], "7": [3]}
    assert [r.sample for r in rollouts.responses] == [0, 0, 1, 0]


def test_defaults_blank_lines_and_extra_keys(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "r.jsonl", [text_row(extra={"x": 1}), "", text_row()])
    rollouts = load_rollouts(path)
    assert [r.source_row for r in rollouts.responses] == [1, 3]
    assert rollouts.responses[0].temperature == 1.0
    assert rollouts.responses[0].step is None


def test_aliases(tmp_path: Path) -> None:
    row = good_row(group=None, logprobs=None, sum_pi2=None)
    row.update(uid="u1", old_log_probs=[-1.0, -2.0, -3.0], sum_pi_squared=[0.2, 0.2, 0.3])
    (r,) = load_rollouts(write_jsonl(tmp_path / "r.jsonl", [row])).responses
    assert (r.group, r.logprobs, r.sum_pi2) == ("u1", [-1.0, -2.0, -3.0], [0.2, 0.2, 0.3])


def test_alias_errors_name_the_key_the_file_used(tmp_path: Path) -> None:
    row = good_row(logprobs=None)
    row["old_log_probs"] = [-1.0]
    message = read_error(write_jsonl(tmp_path / "r.jsonl", [row]))
    assert "field 'old_log_probs'" in message


def test_token_rewards_alone_satisfy_the_reward_requirement(tmp_path: Path) -> None:
    (r,) = load_rollouts(write_jsonl(tmp_path / "r.jsonl", [good_row(reward=None)])).responses
    assert r.reward is None and r.token_rewards == [0.0, 0.0, 1.0]


VERL_ROWS = [
    {"input": "q1", "output": "a", "score": 1.0, "step": 1, "gts": "a", "acc": True},
    {"input": "q2", "output": "b", "score": 0.0, "step": 1, "gts": "c", "acc": False},
    {"input": "q1", "output": "c", "score": 0.0, "step": 1, "gts": "a", "acc": False},
    {"input": "q1", "output": "a", "score": 1.0, "step": 2, "gts": "a", "acc": True},
]


@pytest.mark.parametrize("suffix", [".jsonl", ".parquet"])
def test_verl_dump_groups_by_step_and_input(tmp_path: Path, suffix: str) -> None:
    path = tmp_path / f"dump{suffix}"
    (write_jsonl if suffix == ".jsonl" else write_parquet)(path, VERL_ROWS)
    rollouts = load_rollouts(path)
    assert rollouts.format == f"verl-{suffix[1:]}"
    assert group_rows(rollouts.responses) == {"s1:0": [0, 2], "s1:1": [1], "s2:0": [3]}
    first = rollouts.responses[0]
    assert (first.prompt, first.response, first.reward, first.step) == ("q1", "a", 1.0, 1)
    assert [r.sample for r in rollouts.responses] == [0, 0, 1, 0]


def test_verl_dump_uses_uid_when_present(tmp_path: Path) -> None:
    rows = [{**row, "uid": f"u{i % 2}"} for i, row in enumerate(VERL_ROWS)]
    rollouts = load_rollouts(write_jsonl(tmp_path / "dump.jsonl", rows))
    assert group_rows(rollouts.responses) == {"u0": [0, 2], "u1": [1, 3]}


def test_verl_errors_name_verl_fields(tmp_path: Path) -> None:
    rows = [VERL_ROWS[0], {**VERL_ROWS[1], "score": "high"}]
    message = read_error(write_jsonl(tmp_path / "dump.jsonl", rows))
    assert "line 2" in message and "field 'score'" in message


def test_verl_dump_without_step_or_uid_is_an_error(tmp_path: Path) -> None:
    rows = [VERL_ROWS[0], {k: v for k, v in VERL_ROWS[1].items() if k != "step"}]
    message = read_error(write_jsonl(tmp_path / "dump.jsonl", rows))
    assert "line 2" in message and "field 'step'" in message


def test_one_response_per_row(tmp_path: Path) -> None:
    rollouts = load_rollouts(write_jsonl(tmp_path / "r.jsonl", [good_row(), text_row()]))
    assert len(rollouts.responses) == 2
    assert rollouts.responses[0].response_ids == [3, 1, 2]


# --- property: JSONL and Parquet round trip -------------------------------------------------

_text = st.text(st.characters(exclude_categories=("Cs",)), max_size=8)
_float = st.floats(allow_nan=False, allow_infinity=False, width=64)


@st.composite
def rollout_row(draw: st.DrawFn) -> dict[str, Any]:
    """A valid row: text only, or ids with any subset of the per-token fields."""
    row: dict[str, Any] = {"group": draw(st.sampled_from(["a", "b", "c"])), "reward": draw(_float)}
    if draw(st.booleans()):
        row.update(prompt=draw(_text), response=draw(_text.filter(bool)))
    else:
        n = draw(st.integers(1, 5))
        row["prompt_ids"] = draw(st.lists(st.integers(0, 10**6), min_size=1, max_size=4))
        row["response_ids"] = draw(st.lists(st.integers(0, 10**6), min_size=n, max_size=n))
        # Physically possible values (probability_checks.py): log p ≤ 0, p² ≤ Σπ² ≤ 1, ρ ≥ 0.
        logprobs = draw(st.lists(st.floats(-30.0, 0.0), min_size=n, max_size=n))
        share = draw(st.lists(st.floats(0.0, 1.0), min_size=n, max_size=n))
        values = {
            "mask": draw(st.lists(st.sampled_from([0, 1]), min_size=n, max_size=n)),
            "token_rewards": draw(st.lists(_float, min_size=n, max_size=n)),
            "logprobs": logprobs,
            "sum_pi2": [
                math.exp(2 * lp) + u * (1 - math.exp(2 * lp))
                for lp, u in zip(logprobs, share, strict=True)
            ],
            "is_weights": draw(st.lists(st.floats(0.0, 1e6), min_size=n, max_size=n)),
        }
        for name in TOKEN_FIELDS:
            if draw(st.booleans()):
                row[name] = values[name]
        if "sum_pi2" in row and "logprobs" not in row:
            row["sum_pi2"] = [1.0] * n  # without logprobs, p is unknown
    if draw(st.booleans()):
        row["step"] = draw(st.integers(0, 10**9))
    if draw(st.booleans()):
        row["temperature"] = draw(st.floats(min_value=0.01, max_value=10.0))
    return row


def expected_responses(rows: list[dict[str, Any]]) -> list[Response]:
    samples: dict[str, int] = {}
    out = []
    for row in rows:
        sample = samples[row["group"]] = samples.get(row["group"], -1) + 1
        out.append(Response(sample=sample, source_row=0, **{"temperature": 1.0, **row}))
    return out


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(rows=st.lists(rollout_row(), min_size=1, max_size=6))
def test_written_rows_read_back_unchanged(tmp_path: Path, rows: list[dict[str, Any]]) -> None:
    expected = expected_responses(rows)
    for path in (
        write_jsonl(tmp_path / "p.jsonl", rows),
        write_parquet(tmp_path / "p.parquet", rows),
    ):
        got = load_rollouts(path).responses
        assert [dataclasses.replace(r, source_row=0) for r in got] == expected


@pytest.mark.parametrize("fmt", ["jsonl", "parquet"])
def test_an_empty_response_is_kept_not_refused(tmp_path: Path, fmt: str) -> None:
    """An aborted generation (verl keeps its row, all-zero mask): a row with no response token
    is read and kept in its group, and its batch row has length 0; the file is not refused."""
    empty = good_row(response="", response_ids=[], reward=0.0, **{k: [] for k in TOKEN_FIELDS})
    rows = [good_row(), empty, good_row()]
    write = write_jsonl if fmt == "jsonl" else write_parquet
    rollouts = load_rollouts(write(tmp_path / f"r.{fmt}", rows))
    assert [len(r.response_ids) for r in rollouts.responses] == [3, 0, 3]
    assert group_rows(rollouts.responses) == {"g": [0, 1, 2]}
    batch = make_batch(rollouts)
    assert batch.length.tolist() == [3, 0, 3]
    assert batch.mask[1].sum() == 0 and batch.reward[1] == 0


def test_an_empty_text_response_tokenizes_to_no_token(tmp_path: Path) -> None:
    rows = [text_row(), text_row(response="", reward=0.0)]
    rollouts = load_rollouts(write_jsonl(tmp_path / "r.jsonl", rows))
    tokenized, _ = tokenize_rollouts(rollouts, char_tokenizer())
    assert [len(r.response_ids) for r in tokenized.responses] == [3, 0]
    assert make_batch(tokenized).length.tolist() == [3, 0]
