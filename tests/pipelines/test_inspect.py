"""The rollout summary of `otb-diag rollouts inspect` (otb_diag/pipelines/inspect/recipe.py),
its typed result (otb_diag/pipelines/results/inspect.py) and the text it prints."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from otb_diag.errors import InputError
from otb_diag.io.rollouts.readers import Response, Rollouts
from otb_diag.pipelines.inspect.recipe import summarize
from otb_diag.pipelines.results.inspect import (
    GroupSizes,
    InspectResult,
    MaskedTokens,
    TokenLengths,
    UniformGroups,
)
from otb_diag.pipelines.results.schema import SCHEMA_VERSION


def make_rollouts(rows: list[tuple[str, float, int, dict]]) -> Rollouts:
    """Rollouts from (group, reward, response length, other fields) tuples, ids 0..length-1."""
    responses = [
        Response(
            group=group,
            sample=0,
            source_row=i + 1,
            prompt_ids=[0],
            response_ids=list(range(length)),
            reward=reward,
            **fields,
        )
        for i, (group, reward, length, fields) in enumerate(rows)
    ]
    return Rollouts(Path("r.jsonl"), "jsonl", responses)


# Lengths sorted are 1 2 2 2 3 3 3 4 4 5 11: with numpy's linear interpolation over 11 values,
# p10 is the value at index 1 (2), the median at index 5 (3), p90 at index 9 (5); total 40.
HAND_BUILT = make_rollouts(
    [
        ("all-pass", 1.0, 3, {"step": 10}),
        ("all-pass", 1.0, 2, {"step": 10}),
        ("all-pass", 1.0, 4, {"step": 10}),
        ("all-pass", 1.0, 11, {"step": 10, "mask": [1] * 4 + [0] * 3 + [1] * 4}),
        ("mixed", 0.0, 2, {"step": 20}),
        ("mixed", 1.0, 3, {"step": 20}),
        ("mixed", 0.0, 4, {"step": 20, "temperature": 0.7}),
        ("mixed", 1.0, 5, {"step": 20}),
        ("all-fail", 0.0, 1, {}),
        ("all-fail", 0.0, 2, {}),
        ("alone", 1.0, 3, {}),
    ]
)


@pytest.fixture(scope="module")
def summary() -> InspectResult:
    return summarize(HAND_BUILT)


def test_counts_and_group_sizes(summary: InspectResult) -> None:
    assert (summary.rows, summary.groups) == (11, 4)
    assert summary.group_size == GroupSizes(
        min=1.0, median=3.0, max=4.0, counts={"1": 1, "2": 1, "4": 2}
    )
    assert summary.singleton_groups == ["alone"]


def test_response_lengths(summary: InspectResult) -> None:
    assert summary.response_tokens == TokenLengths(
        total=40,
        min=1,
        p10=2,
        median=3,
        p90=5,
        max=11,
        mean=pytest.approx(40 / 11),
        max_over_min=11,
    )


def test_rewards(summary: InspectResult) -> None:
    reward = summary.reward
    mean = 7 / 11
    assert reward.mean == pytest.approx(mean)
    assert reward.std == pytest.approx((mean * (1 - mean)) ** 0.5)  # Bernoulli, ddof 0
    assert (reward.min, reward.max, reward.binary) == (0.0, 1.0, True)
    assert reward.share_one == pytest.approx(7 / 11)
    assert reward.share_zero == pytest.approx(4 / 11)
    assert reward.histogram == {"0": 4, "1": 7}
    # group pass rates: all-pass 1, mixed 0.5, all-fail 0, alone 1
    means = summary.group_mean_reward
    assert (means.min, means.median, means.max) == (0.0, 0.75, 1.0)
    assert means.mean == pytest.approx(2.5 / 4)


def test_all_equal_groups_exclude_groups_of_one(summary: InspectResult) -> None:
    assert summary.uniform_groups == UniformGroups(
        count=2, of=3, share=pytest.approx(2 / 3), by_value={"0": 1, "1": 1}
    )


def test_masked_share_temperatures_steps_fields(summary: InspectResult) -> None:
    assert summary.masked_tokens == MaskedTokens(count=3, of=40, share=pytest.approx(3 / 40))
    assert summary.temperatures == [0.7, 1.0]
    assert summary.steps == [10, 20]
    present = summary.fields_present
    assert (present["response_ids"], present["mask"], present["step"], present["prompt"]) == (
        11,
        1,
        8,
        0,
    )


def test_json_round_trips_with_the_version_first(summary: InspectResult) -> None:
    """`--json` prints `to_json()`: the version, the command, then the summary's keys as before
    (the rollouts' format under "format"); it reads back into an equal result."""
    written = json.loads(json.dumps(summary.to_json()))
    assert list(written)[:4] == ["schema_version", "command", "path", "format"]
    assert written["schema_version"] == SCHEMA_VERSION and written["format"] == "jsonl"
    assert written["group_size"]["counts"] == {"1": 1, "2": 1, "4": 2}
    assert written["round_trip_issues"] == [] and "rollouts_format" not in written
    assert InspectResult.from_json(written, Path("i.json")) == summary


@pytest.mark.parametrize("version", [None, SCHEMA_VERSION + 1])
def test_another_version_is_refused(summary: InspectResult, version: int | None) -> None:
    data = summary.to_json()
    if version is None:
        del data["schema_version"]
    else:
        data["schema_version"] = version
    with pytest.raises(InputError, match="schema_version") as caught:
        InspectResult.from_json(data, Path("i.json"))
    assert caught.value.path == Path("i.json")
    assert "Re-run `otb-diag rollouts inspect`" in str(caught.value)


def test_token_rewards_count_as_their_sum() -> None:
    rollouts = make_rollouts(
        [("g", None, 2, {"token_rewards": [0.5, 1.0]}), ("g", 1.5, 1, {})]  # type: ignore[list-item]
    )
    summary = summarize(rollouts)
    assert summary.reward.mean == 1.5
    assert summary.uniform_groups.count == 1


def test_non_binary_rewards_with_many_values() -> None:
    rollouts = make_rollouts([("g", i / 10, 1, {}) for i in range(11)])
    reward = summarize(rollouts).reward
    assert reward.binary is False
    assert reward.share_one is None
    assert reward.histogram is None  # 11 distinct values: too many to list


def test_without_token_ids_the_token_statistics_are_unknown() -> None:
    rollouts = make_rollouts([("g", 1.0, 2, {}), ("g", 0.0, 2, {})])
    rollouts.responses[1] = Response(
        group="g", sample=1, source_row=2, prompt="p", response="r", reward=0.0
    )
    summary = summarize(rollouts)
    assert summary.response_tokens is None and summary.masked_tokens is None
    assert "unknown (no token ids" in summary.format()
    assert InspectResult.from_json(summary.to_json(), Path("i.json")) == summary  # None kept


def test_format(summary: InspectResult) -> None:
    text = summary.format()
    lines = text.splitlines()
    labels = dict(line.split("  ", 1) for line in lines)
    assert labels["rollouts"].strip() == "r.jsonl (jsonl)"
    assert "1 of size 1, 1 of size 2, 2 of size 4" in labels["groups"]
    assert labels["groups of one"].strip() == "1: alone"
    assert "p10 2, median 3, p90 5, max 11" in labels["response tokens"]
    assert "max/min 11" in labels["response tokens"]
    assert labels["reward"].strip() == "mean 0.6364, std 0.481, min 0, max 1; binary: 63.6% are 1"
    assert labels["pass rate / group"].strip() == "min 0, median 0.75, mean 0.625, max 1"
    assert labels["all-equal groups"].strip().startswith("2 of 3 (66.7%)")
    assert labels["masked tokens"].strip() == "3 of 40 (7.5%)"
    assert labels["steps"].strip() == "2 (10 to 20)"
    # values start in one column
    starts = {
        len(line) - len(value.lstrip()) for line, value in zip(lines, labels.values(), strict=True)
    }
    assert len(starts) == 1


def test_the_entry_point_says_its_defaults_and_the_rows_that_do_not_round_trip(
    tmp_path: Path,
) -> None:
    """Text-only rows tokenized by the embedded checkpoint (its tokenizer, since none is given):
    every text that does not survive the round trip is in the result, and it says them in one
    line, their count and the first, however many rows fail."""
    from otb_diag.pipelines.inputs import Inputs
    from otb_diag.pipelines.inspect.recipe import run_inspect

    bad = 12
    rows = [{"group": "g", "prompt": "C:12=", "response": "12", "reward": 1.0}]
    rows += [{"group": "g", "prompt": "C:12=", "response": "1é2", "reward": 0.0}] * bad
    path = tmp_path / "r.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    said: list[str] = []
    result = run_inspect(Inputs(rollouts=path), say=said.append)
    assert result is not None and result.rows == bad + 1
    assert said[0].startswith("no --ckpt given: using the embedded default")
    assert len(result.round_trip_issues) == bad
    assert "line 2, field 'response'" in result.round_trip_issues[0]
    trips = [line for line in said if line.startswith("round trip")]
    assert trips == [
        f"round trip: {bad} text field(s) not reproduced by the tokenizer; first: "
        f"{result.round_trip_issues[0]}; {bad - 1} more in --json"
    ]
    assert result.to_json()["round_trip_issues"] == result.round_trip_issues


def test_round_trip_line_counts_every_field_and_names_the_first() -> None:
    """A 24-row dump whose prompt and response both fail: 48 issues, one line."""
    from otb_diag.pipelines.inspect.recipe import round_trip_line

    issues = [f"row {i // 2}, field '{('prompt', 'response')[i % 2]}': ..." for i in range(48)]
    line = round_trip_line(issues)
    assert line == (
        "round trip: 48 text field(s) not reproduced by the tokenizer; first: "
        "row 0, field 'prompt': ...; 47 more in --json"
    )
    assert "\n" not in line
    assert round_trip_line(issues[:1]).endswith("first: row 0, field 'prompt': ...")
