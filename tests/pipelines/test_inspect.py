"""The rollout summary of `otb-diag rollouts inspect` (otb_diag/pipelines/inspect.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from otb_diag.io.rollouts.readers import Response, Rollouts
from otb_diag.pipelines.inspect.recipe import format_summary, summarize


def make_rollouts(rows: list[tuple[str, float, int, dict[str, Any]]]) -> Rollouts:
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
def summary() -> dict[str, Any]:
    return summarize(HAND_BUILT)


def test_counts_and_group_sizes(summary: dict[str, Any]) -> None:
    assert (summary["rows"], summary["groups"]) == (11, 4)
    assert summary["group_size"] == {
        "min": 1.0,
        "median": 3.0,
        "max": 4.0,
        "counts": {"1": 1, "2": 1, "4": 2},
    }
    assert summary["singleton_groups"] == ["alone"]


def test_response_lengths(summary: dict[str, Any]) -> None:
    assert summary["response_tokens"] == pytest.approx(
        {
            "total": 40,
            "min": 1,
            "p10": 2,
            "median": 3,
            "p90": 5,
            "max": 11,
            "mean": 40 / 11,
            "max_over_min": 11,
        }
    )


def test_rewards(summary: dict[str, Any]) -> None:
    reward = summary["reward"]
    mean = 7 / 11
    assert reward["mean"] == pytest.approx(mean)
    assert reward["std"] == pytest.approx((mean * (1 - mean)) ** 0.5)  # Bernoulli, ddof 0
    assert (reward["min"], reward["max"], reward["binary"]) == (0.0, 1.0, True)
    assert reward["share_one"] == pytest.approx(7 / 11)
    assert reward["share_zero"] == pytest.approx(4 / 11)
    assert reward["histogram"] == {"0": 4, "1": 7}
    # group pass rates: all-pass 1, mixed 0.5, all-fail 0, alone 1
    assert summary["group_mean_reward"] == pytest.approx(
        {"min": 0.0, "median": 0.75, "mean": 2.5 / 4, "max": 1.0}
    )


def test_all_equal_groups_exclude_groups_of_one(summary: dict[str, Any]) -> None:
    assert summary["uniform_groups"] == {
        "count": 2,
        "of": 3,
        "share": pytest.approx(2 / 3),
        "by_value": {"0": 1, "1": 1},
    }


def test_masked_share_temperatures_steps_fields(summary: dict[str, Any]) -> None:
    assert summary["masked_tokens"] == {"count": 3, "of": 40, "share": pytest.approx(3 / 40)}
    assert summary["temperatures"] == [0.7, 1.0]
    assert summary["steps"] == [10, 20]
    present = summary["fields_present"]
    assert (present["response_ids"], present["mask"], present["step"], present["prompt"]) == (
        11,
        1,
        8,
        0,
    )


def test_summary_is_json(summary: dict[str, Any]) -> None:
    assert json.loads(json.dumps(summary)) == summary


def test_token_rewards_count_as_their_sum() -> None:
    rollouts = make_rollouts(
        [("g", None, 2, {"token_rewards": [0.5, 1.0]}), ("g", 1.5, 1, {})]  # type: ignore[list-item]
    )
    summary = summarize(rollouts)
    assert summary["reward"]["mean"] == 1.5
    assert summary["uniform_groups"]["count"] == 1


def test_non_binary_rewards_with_many_values() -> None:
    rollouts = make_rollouts([("g", i / 10, 1, {}) for i in range(11)])
    reward = summarize(rollouts)["reward"]
    assert reward["binary"] is False
    assert reward["share_one"] is None
    assert reward["histogram"] is None  # 11 distinct values: too many to list


def test_without_token_ids_the_token_statistics_are_unknown() -> None:
    rollouts = make_rollouts([("g", 1.0, 2, {}), ("g", 0.0, 2, {})])
    rollouts.responses[1] = Response(
        group="g", sample=1, source_row=2, prompt="p", response="r", reward=0.0
    )
    summary = summarize(rollouts)
    assert summary["response_tokens"] is None and summary["masked_tokens"] is None
    assert "unknown (no token ids" in format_summary(summary)


def test_format_summary(summary: dict[str, Any]) -> None:
    text = format_summary(summary)
    lines = text.splitlines()
    labels = dict(line.split("  ", 1) for line in lines)
    assert labels["rollouts"].strip() == "r.jsonl (jsonl)"
    assert "1 of size 1, 1 of size 2, 2 of size 4" in labels["groups"]
    assert labels["groups of one"].strip() == "1: alone"
    assert "p10 2, median 3, p90 5, max 11" in labels["response tokens"]
    assert "max/min 11" in labels["response tokens"]
    assert "63.6% are 1" in labels["reward"]
    assert "pass rate / group" in labels
    assert labels["all-equal groups"].strip().startswith("2 of 3 (66.7%)")
    assert labels["masked tokens"].strip() == "3 of 40 (7.5%)"
    assert labels["steps"].strip() == "2 (10 to 20)"
    # values start in one column
    starts = {
        len(line) - len(value.lstrip()) for line, value in zip(lines, labels.values(), strict=True)
    }
    assert len(starts) == 1
