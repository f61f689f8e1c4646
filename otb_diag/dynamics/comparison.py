"""Baselines compared at equal tokens (the OTB paper's comparison): the runs of one arm (a
baseline at a group size, its seeds sharing a `--label`) summarised over the seeds.

For an arm of n runs, k of which reach the target score (`collapse.py:tokens_to_target`: the
tokens sampled until the trailing-mean score first reaches it):

    tokens_to_target_mean = (1/k) Σ_runs x_r            over the k runs that reached it
    interval              = mean ± t_{0.975, k−1} · s / √k,   s the sample sd (k ≥ 2),
                            its lower end cut at 0 (tokens are not negative)

Student's t interval of the mean over seeds (the seeds are independent draws of the run); a
run that never reached the target is counted (`reached` k of n), not averaged in: the mean is
then that of the runs that reached it, which flatters a slow arm, so the table says k of n. The
final smoothed score is summarised the same way over all n runs, and the collapse detector's
verdict is given per run. The optimizer updates to the target (`io/training_logs.py:_updates`, at
the same row as the tokens) are summarised as the tokens are: an arm's point on the
steps-against-tokens curve, with an interval on each axis.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Protocol

import numpy as np
from scipy import stats

CONFIDENCE = 0.95


class RunOutcome(Protocol):
    """What the comparison reads of one run (`pipelines/results/dynamics.py:DynamicsRun`)."""

    @property
    def run(self) -> str: ...
    @property
    def baseline(self) -> str | None: ...
    @property
    def group_size(self) -> int | None: ...
    @property
    def collapse_step(self) -> int | None: ...
    @property
    def tokens_to_target(self) -> float | None: ...
    @property
    def updates_to_target(self) -> int | None: ...
    @property
    def final_score_smoothed(self) -> float | None: ...


def mean_interval(
    values: Sequence[float], floor: float = -math.inf
) -> tuple[float | None, float | None, float | None]:
    """(mean, low, high) of `values` with Student's t interval at `CONFIDENCE`, cut at `floor`
    (the mean of a quantity that cannot be below it is not: tokens are ≥ 0, and two or three
    seeds give a t interval whose lower end often is below 0, which said nothing); the interval
    is None below two values, everything None without any."""
    x = np.asarray(values, dtype=float)
    if x.size == 0:
        return None, None, None
    mean = float(x.mean())
    if x.size < 2:
        return mean, None, None
    half = float(stats.t.ppf(0.5 + CONFIDENCE / 2, x.size - 1)) * float(x.std(ddof=1))
    half /= math.sqrt(x.size)
    return mean, max(mean - half, floor), mean + half


def compare_arms(runs: Sequence[RunOutcome], arms: Sequence[str]) -> list[dict[str, object]]:
    """One row per arm (`arms[i]` is the arm of `runs[i]`; arms in order of first appearance):
    its baseline and group size, its runs, the collapse verdict of each (`collapse_steps`, None
    for a run without one), tokens to the target (each run's, and mean and interval over those
    that reached it), the updates to it (the same) and the final smoothed score (mean and
    interval over all runs)."""
    rows = []
    for arm in dict.fromkeys(arms):
        members = [r for r, a in zip(runs, arms, strict=True) if a == arm]
        reached = [r.tokens_to_target for r in members if r.tokens_to_target is not None]
        finals = [r.final_score_smoothed for r in members if r.final_score_smoothed is not None]
        tokens = mean_interval(reached, floor=0.0)
        updates = mean_interval(
            [r.updates_to_target for r in members if r.updates_to_target is not None], floor=0.0
        )
        score = mean_interval(finals)
        rows.append(
            {
                "arm": arm,
                "baseline": members[0].baseline,
                "group_size": members[0].group_size,
                "runs": [r.run for r in members],
                "collapse_steps": [r.collapse_step for r in members],
                "collapsed": sum(r.collapse_step is not None for r in members),
                "tokens_to_target": [r.tokens_to_target for r in members],
                "reached": len(reached),
                "tokens_to_target_mean": tokens[0],
                "tokens_to_target_low": tokens[1],
                "tokens_to_target_high": tokens[2],
                "updates_to_target": [r.updates_to_target for r in members],
                "updates_to_target_mean": updates[0],
                "updates_to_target_low": updates[1],
                "updates_to_target_high": updates[2],
                "final_score_mean": score[0],
                "final_score_low": score[1],
                "final_score_high": score[2],
            }
        )
    return rows
