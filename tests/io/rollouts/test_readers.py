"""Reading, validating and tokenizing rollout files (otb_diag/io/rollouts/readers.py)."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer, decoders, models, processors
from transformers import PreTrainedTokenizerFast

from otb_diag.errors import InputError
from otb_diag.io.rollouts.readers import (
    TOKEN_FIELDS,
    Response,
    check_vocab,
    read_rollouts,
    tokenize_rollouts,
)

# --- fixtures -------------------------------------------------------------------------------


def good_row(**changes: Any) -> dict[str, Any]:
    """A valid row with ids and every per-token field; `changes` overrides or (None) removes."""
    row = {
        "group": "g",
        "prompt": "ab",
        "response": "cab",
        "prompt_ids": [1, 2],
        "response_ids": [3, 1, 2],
        "reward": 1.0,
        "token_rewards": [0.0, 0.0, 1.0],
        "mask": [1, 0, 1],
        "step": 7,
        "logprobs": [-1.0, -1.2, -1.5],
        "sum_pi2": [0.5, 0.6, 0.7],
        "is_weights": [1.0, 0.9, 1.1],
        "temperature": 0.8,
    }
    row.update(changes)
    return {k: v for k, v in row.items() if v is not None}


def text_row(**changes: Any) -> dict[str, Any]:
    """A valid row with text only (no ids, no per-token fields)."""
    row = {"group": "g", "prompt": "ab", "response": "cab", "reward": 1.0}
    row.update(changes)
    return {k: v for k, v in row.items() if v is not None}


def write_jsonl(path: Path, rows: list[dict[str, Any] | str]) -> Path:
    """One JSON object (or a raw string, for malformed lines) per line."""
    lines = [r if isinstance(r, str) else json.dumps(r, ensure_ascii=False) for r in rows]
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


def write_parquet(path: Path, rows: list[dict[str, Any]]) -> Path:
    keys = list(dict.fromkeys(k for r in rows for k in r))
    pq.write_table(pa.Table.from_pylist([{k: r.get(k) for k in keys} for r in rows]), path)
    return path


def char_tokenizer() -> PreTrainedTokenizerFast:
    """One token per character of "abc xyz:=" plus <unk> and a BOS <s> added to encodings."""
    vocab = {tok: i for i, tok in enumerate(["<unk>", "<s>", *"abc xyz:="])}
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
    backend.decoder = decoders.Fuse()
    backend.post_processor = processors.TemplateProcessing(
        single="<s> $A", special_tokens=[("<s>", vocab["<s>"])]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        bos_token="<s>",
        unk_token="<unk>",
        clean_up_tokenization_spaces=False,
    )


def read_error(path: Path) -> str:
    with pytest.raises(InputError) as info:
        read_rollouts(path)
    return str(info.value)


# --- good input -----------------------------------------------------------------------------


def test_jsonl_and_parquet_read_the_same_responses(tmp_path: Path) -> None:
    rows = [good_row(), good_row(group="h"), text_row()]
    from_jsonl = read_rollouts(write_jsonl(tmp_path / "r.jsonl", rows))
    from_parquet = read_rollouts(write_parquet(tmp_path / "r.parquet", rows))
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
    assert read_rollouts(path).responses[0].mask == [1, 0, 1]


def test_json_suffix_reads_as_json_lines(tmp_path: Path) -> None:
    assert read_rollouts(write_jsonl(tmp_path / "r.json", [text_row()])).format == "jsonl"


def test_unicode_line_separators_inside_strings_do_not_split_lines(tmp_path: Path) -> None:
    text = "a\u2028b\x85c\rd"  # str.splitlines() would break the line at each of these
    path = write_jsonl(tmp_path / "r.jsonl", [text_row(response=text), text_row()])
    assert [r.response for r in read_rollouts(path).responses] == [text, "cab"]


def test_groups_and_samples_follow_file_order(tmp_path: Path) -> None:
    rows = [text_row(group="b"), text_row(group="a"), text_row(group="b"), text_row(group=7)]
    rollouts = read_rollouts(write_jsonl(tmp_path / "r.jsonl", rows))
    assert rollouts.groups() == {"b": [0, 2], "a": [1], "7": [3]}
    assert [r.sample for r in rollouts.responses] == [0, 0, 1, 0]


def test_defaults_blank_lines_and_extra_keys(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "r.jsonl", [text_row(extra={"x": 1}), "", text_row()])
    rollouts = read_rollouts(path)
    assert [r.source_row for r in rollouts.responses] == [1, 3]
    assert rollouts.responses[0].temperature == 1.0
    assert rollouts.responses[0].step is None


def test_aliases(tmp_path: Path) -> None:
    row = good_row(group=None, logprobs=None, sum_pi2=None)
    row.update(uid="u1", old_log_probs=[-1.0, -2.0, -3.0], sum_pi_squared=[0.2, 0.2, 0.3])
    (r,) = read_rollouts(write_jsonl(tmp_path / "r.jsonl", [row])).responses
    assert (r.group, r.logprobs, r.sum_pi2) == ("u1", [-1.0, -2.0, -3.0], [0.2, 0.2, 0.3])


def test_alias_errors_name_the_key_the_file_used(tmp_path: Path) -> None:
    row = good_row(logprobs=None)
    row["old_log_probs"] = [-1.0]
    message = read_error(write_jsonl(tmp_path / "r.jsonl", [row]))
    assert "field 'old_log_probs'" in message


def test_token_rewards_alone_satisfy_the_reward_requirement(tmp_path: Path) -> None:
    (r,) = read_rollouts(write_jsonl(tmp_path / "r.jsonl", [good_row(reward=None)])).responses
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
    rollouts = read_rollouts(path)
    assert rollouts.format == f"verl-{suffix[1:]}"
    assert rollouts.groups() == {"s1:0": [0, 2], "s1:1": [1], "s2:0": [3]}
    first = rollouts.responses[0]
    assert (first.prompt, first.response, first.reward, first.step) == ("q1", "a", 1.0, 1)
    assert [r.sample for r in rollouts.responses] == [0, 0, 1, 0]


def test_verl_dump_uses_uid_when_present(tmp_path: Path) -> None:
    rows = [{**row, "uid": f"u{i % 2}"} for i, row in enumerate(VERL_ROWS)]
    rollouts = read_rollouts(write_jsonl(tmp_path / "dump.jsonl", rows))
    assert rollouts.groups() == {"u0": [0, 2], "u1": [1, 3]}


def test_verl_errors_name_verl_fields(tmp_path: Path) -> None:
    rows = [VERL_ROWS[0], {**VERL_ROWS[1], "score": "high"}]
    message = read_error(write_jsonl(tmp_path / "dump.jsonl", rows))
    assert "line 2" in message and "field 'score'" in message


def test_verl_dump_without_step_or_uid_is_an_error(tmp_path: Path) -> None:
    rows = [VERL_ROWS[0], {k: v for k, v in VERL_ROWS[1].items() if k != "step"}]
    message = read_error(write_jsonl(tmp_path / "dump.jsonl", rows))
    assert "line 2" in message and "field 'step'" in message


def test_to_frame_has_one_row_per_response(tmp_path: Path) -> None:
    rollouts = read_rollouts(write_jsonl(tmp_path / "r.jsonl", [good_row(), text_row()]))
    frame = rollouts.to_frame()
    assert len(frame) == 2
    assert frame.loc[0, "response_ids"] == [3, 1, 2]
    assert list(frame.columns) == [f.name for f in dataclasses.fields(Response)]


# --- bad input ------------------------------------------------------------------------------

# (bad row, field the error names, words the message contains); the bad row goes on line 2.
BAD_ROWS = [
    (good_row(reward=None, token_rewards=None, rewrd=1.0), "reward", "'reward' or 'token_rewards'"),
    (
        good_row(reward=None, token_rewards=None, rewrd=1.0),
        "reward",
        "(found 'rewrd': misspelled?)",
    ),
    (good_row(group=None), "group", "missing required field 'group' or 'uid'"),
    (good_row(response=None, response_ids=None), "response", "missing required field"),
    (good_row(prompt=None, prompt_ids=None), "prompt", "missing required field"),
    (good_row(reward="1.0"), "reward", "expected a number, got str '1.0'"),
    (good_row(response_ids=[3, 1.5, 2]), "response_ids", "entry 1"),
    (good_row(response_ids=[3, "1", 2]), "response_ids", "entry 1"),
    (good_row(prompt_ids=[1, -2]), "prompt_ids", "non-negative"),
    (good_row(response_ids="3 1 2"), "response_ids", "expected a list"),
    (good_row(mask=[1, 2, 1]), "mask", "mask values are 0 or 1"),
    (good_row(reward=float("nan")), "reward", "finite"),
    (good_row(reward=float("inf")), "reward", "finite"),
    (good_row(token_rewards=[0.0, float("-inf"), 1.0]), "token_rewards", "entry 1"),
    (good_row(logprobs=[0.0, float("nan"), 1.0]), "logprobs", "entry 1"),
    (good_row(prompt=3), "prompt", "expected a string"),
    (good_row(group=[1]), "group", "expected a string or an integer"),
    (good_row(step=1.5), "step", "expected an integer"),
    (good_row(temperature=0), "temperature", "positive"),
    (good_row(response="", response_ids=None, **dict.fromkeys(TOKEN_FIELDS)), "response", "empty"),
    (good_row(response_ids=[], **dict.fromkeys(TOKEN_FIELDS)), "response_ids", "no tokens"),
    (good_row(prompt_ids=[]), "prompt_ids", "no tokens"),
] + [
    (good_row(**{name: [1, 1]}), name, "has 2 entries but the response has 3 tokens")
    for name in TOKEN_FIELDS
]


@pytest.mark.parametrize(("bad", "field", "words"), BAD_ROWS)
def test_bad_jsonl_row_names_file_line_and_field(
    tmp_path: Path, bad: dict[str, Any], field: str, words: str
) -> None:
    path = write_jsonl(tmp_path / "r.jsonl", [good_row(), bad])
    message = read_error(path)
    assert message.startswith(f"{path}, line 2, field '{field}': ")
    assert words in message


# Parquet columns hold one type, so only value errors can sit in a row of their own.
PARQUET_BAD_ROWS = [
    (good_row(reward=float("nan")), "reward", "finite"),
    (good_row(mask=[1, 2, 1]), "mask", "0 or 1"),
    (good_row(logprobs=[0.0, 1.0]), "logprobs", "has 2 entries"),
    (good_row(response="", response_ids=None, **dict.fromkeys(TOKEN_FIELDS)), "response", "empty"),
    (good_row(reward=None, token_rewards=None), "reward", "missing required field 'reward'"),
]


@pytest.mark.parametrize(("bad", "field", "words"), PARQUET_BAD_ROWS)
def test_bad_parquet_row_names_file_row_and_field(
    tmp_path: Path, bad: dict[str, Any], field: str, words: str
) -> None:
    path = write_parquet(tmp_path / "r.parquet", [good_row(), bad])
    message = read_error(path)
    assert message.startswith(f"{path}, row 1, field '{field}': ")
    assert words in message


@pytest.mark.parametrize(
    ("line", "words"),
    [('{"group": "g", "reward": }', "malformed JSON"), ("[1, 2]", "expected a JSON object")],
)
def test_unreadable_json_line(tmp_path: Path, line: str, words: str) -> None:
    path = write_jsonl(tmp_path / "r.jsonl", [good_row(), line])
    message = read_error(path)
    assert message.startswith(f"{path}, line 2: ")
    assert words in message


def test_errors_come_in_file_order(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "r.jsonl", [good_row(), good_row(reward="x"), "{bad"])
    assert read_error(path).startswith(f"{path}, line 2, field 'reward'")


def test_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "nope.jsonl"
    assert read_error(path) == f"{path}: file does not exist"


@pytest.mark.parametrize("content", ["", "\n\n  \n"])
def test_empty_jsonl_file(tmp_path: Path, content: str) -> None:
    path = tmp_path / "r.jsonl"
    path.write_text(content)
    assert read_error(path).startswith(f"{path}: the file has no rows")


def test_empty_parquet_file(tmp_path: Path) -> None:
    path = tmp_path / "r.parquet"
    pq.write_table(pa.table({"group": pa.array([], pa.string())}), path)
    assert read_error(path).startswith(f"{path}: the file has no rows")


def test_unreadable_parquet_file(tmp_path: Path) -> None:
    path = tmp_path / "r.parquet"
    path.write_text("not parquet")
    assert read_error(path).startswith(f"{path}: not a readable Parquet file")


def test_unknown_suffix(tmp_path: Path) -> None:
    path = tmp_path / "r.csv"
    path.write_text("group,reward\n")
    assert "unknown rollout file type '.csv'" in read_error(path)


def test_text_and_ids_disagreeing_keeps_the_ids(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "r.jsonl", [good_row(response="something else")])
    rollouts, issues = tokenize_rollouts(read_rollouts(path), char_tokenizer())
    assert rollouts.responses[0].response_ids == [3, 1, 2]
    assert issues == []


def test_token_id_outside_the_vocabulary(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "r.jsonl", [good_row(), good_row(response_ids=[3, 11, 2])])
    rollouts = read_rollouts(path)
    check_vocab(rollouts, 12)
    with pytest.raises(InputError) as info:
        check_vocab(rollouts, 11)
    message = str(info.value)
    assert message.startswith(f"{path}, line 2, field 'response_ids': token id 11 ")
    assert "size 11" in message


def test_token_id_outside_the_vocabulary_names_the_parquet_row(tmp_path: Path) -> None:
    path = write_parquet(tmp_path / "r.parquet", [good_row(prompt_ids=[1, 40])])
    with pytest.raises(InputError, match=r"row 0, field 'prompt_ids': token id 40 "):
        check_vocab(read_rollouts(path), 12)


# --- tokenizing -----------------------------------------------------------------------------


def test_tokenize_fills_ids_from_text(tmp_path: Path) -> None:
    tok = char_tokenizer()
    path = write_jsonl(tmp_path / "r.jsonl", [text_row(prompt="x:=", response="a b"), good_row()])
    rollouts, issues = tokenize_rollouts(read_rollouts(path), tok)
    assert issues == []
    filled, given = rollouts.responses
    bos, x, colon, eq, a, space, b = tok.convert_tokens_to_ids(["<s>", *"x:=a b"])
    assert filled.prompt_ids == [bos, x, colon, eq]  # prompts get the tokenizer's BOS
    assert filled.response_ids == [a, space, b]  # responses do not
    assert given.prompt_ids == [1, 2] and given.response_ids == [3, 1, 2]
    check_vocab(rollouts, len(tok))


def test_tokenize_reports_texts_that_do_not_round_trip(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "r.jsonl", [text_row(), text_row(response="abé")])
    rollouts, issues = tokenize_rollouts(read_rollouts(path), char_tokenizer())
    (issue,) = issues
    assert (issue.location, issue.field, issue.sample) == ("line 2", "response", 1)
    assert issue.text == "abé" and issue.decoded == "ab<unk>"
    assert "line 2, field 'response'" in str(issue)
    assert len(rollouts.responses[1].response_ids or []) == 3


def test_tokenized_length_mismatch_names_line_and_field(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "r.jsonl", [text_row(), text_row(mask=[1, 1])])
    rollouts = read_rollouts(path)  # no ids yet: the length cannot be checked
    with pytest.raises(InputError) as info:
        tokenize_rollouts(rollouts, char_tokenizer())
    message = str(info.value)
    assert message.startswith(f"{path}, line 2, field 'mask': has 2 entries")
    assert "3 tokens (as tokenized by the checkpoint's tokenizer)" in message


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
        got = read_rollouts(path).responses
        assert [dataclasses.replace(r, source_row=0) for r in got] == expected
