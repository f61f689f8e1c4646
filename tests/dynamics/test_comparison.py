"""The comparison of baselines at equal tokens (`dynamics/comparison.py`): Student's t interval
of the mean over seeds against textbook quantiles, and the arms' rows from their runs."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest

from otb_diag.dynamics.comparison import compare_arms, mean_interval

# t_{0.975, ν} from a printed table (two-sided 95 %): ν = 1, 2.
T_975 = {1: 12.706204736174698, 2: 4.302652729911275}


def test_interval_is_students_t_over_the_seeds() -> None:
    mean, low, high = mean_interval([10.0, 20.0, 30.0])  # sd 10
    half = T_975[2] * 10.0 / math.sqrt(3)
    assert mean == 20.0
    assert (low, high) == (pytest.approx(20.0 - half), pytest.approx(20.0 + half))
    mean, low, high = mean_interval([54_000.0, 108_000.0])
    half = T_975[1] * (54_000.0 / math.sqrt(2)) / math.sqrt(2)  # sd of two values: |a − b|/√2
    assert (mean, low, high) == (
        81_000.0,
        pytest.approx(81_000 - half),
        pytest.approx(81_000 + half),
    )


def test_one_value_has_no_interval_and_none_has_no_mean() -> None:
    # two seeds: t_{0.975, 1} = 12.71 puts the lower end below 0; tokens cut it at 0
    wide = mean_interval([25_426.0, 13_159.0])
    assert wide[1] < 0
    assert mean_interval([25_426.0, 13_159.0], floor=0.0) == (19_292.5, 0.0, wide[2])
    assert mean_interval([3.0]) == (3.0, None, None)
    assert mean_interval([]) == (None, None, None)


def run(name: str, tokens: float | None, collapse: int | None, final: float | None):
    """A run's outcome; its baseline and group size are those its name says, its updates to
    the target a hundredth of its tokens."""
    baseline, size = {"otb": ("otb", 4), "grpo": ("grpo", 16)}[name.split()[0]]
    return SimpleNamespace(
        run=name, baseline=baseline, group_size=size, collapse_step=collapse,
        tokens_to_target=tokens, final_score_smoothed=final,
        updates_to_target=None if tokens is None else int(tokens // 100),
    )  # fmt: skip


def test_arms_gather_their_seeds_in_order_of_appearance() -> None:
    """An arm's mean and interval are over the runs that reached the target (k of n), its
    final score over all; its collapse verdicts stay per run."""
    runs = [
        run("otb N=4#1", 100.0, None, 0.9),
        run("grpo N=16#1", None, 40, 0.2),
        run("otb N=4#2", 300.0, None, 0.7),
        run("grpo N=16#2", 500.0, None, 0.6),
        run("otb N=4#3", None, 12, 0.5),
    ]
    arms = ["otb N=4", "grpo N=16", "otb N=4", "grpo N=16", "otb N=4"]
    otb, grpo = compare_arms(runs, arms)
    assert otb["arm"] == "otb N=4" and grpo["arm"] == "grpo N=16"
    assert otb["runs"] == ["otb N=4#1", "otb N=4#2", "otb N=4#3"]
    assert (otb["baseline"], otb["group_size"]) == ("otb", 4)
    assert otb["collapse_steps"] == [None, None, 12] and otb["collapsed"] == 1
    assert otb["tokens_to_target"] == [100.0, 300.0, None] and otb["reached"] == 2
    half = T_975[1] * (200.0 / math.sqrt(2)) / math.sqrt(2)
    assert otb["tokens_to_target_mean"] == 200.0
    assert otb["tokens_to_target_low"] == max(200.0 - half, 0.0) == 0.0  # tokens are ≥ 0
    # The updates to the target: the same runs, the same interval, on their own scale.
    assert otb["updates_to_target"] == [1, 3, None]
    assert otb["updates_to_target_mean"] == 2.0
    assert otb["updates_to_target_high"] == pytest.approx(2.0 + half / 100)
    assert otb["updates_to_target_low"] == 0.0  # updates are ≥ 0
    assert otb["final_score_mean"] == pytest.approx(0.7)
    half = T_975[2] * 0.2 / math.sqrt(3)  # finals 0.9, 0.7, 0.5: sd 0.2
    assert otb["final_score_high"] == pytest.approx(0.7 + half)
    assert grpo["reached"] == 1 and grpo["tokens_to_target_mean"] == 500.0
    assert grpo["tokens_to_target_low"] is None and grpo["collapse_steps"] == [40, None]
