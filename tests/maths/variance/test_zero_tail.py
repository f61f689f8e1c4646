"""OTB with and without verl's zero tail on the same draws (maths/variance/zero_tail.py): the
tail's part of the estimate, its variance, and whether its mean is zero, on pools where the
answer is known: all-correct groups of varied lengths, scores pure noise (the tail adds variance
only) or with a mean planted on late positions (the tail's tokens carry it)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from otb_diag.maths.returns import outcome_token_rewards, returns_to_go
from otb_diag.maths.variance.intervals import trace_variance
from otb_diag.maths.variance.paired_draws import (
    NO_ZERO_TAIL,
    default_specs,
    paired_estimates,
    variance_table,
)
from otb_diag.maths.variance.zero_tail import tail_mean_square, zero_tail_rows

PROMPTS, POOL, T, K = 12, 16, 12, 8
LATE = 8  # positions from which the planted mean sits


def all_correct_pool(planted: float, seed: int = 0):
    """`PROMPTS` pools of `POOL` responses, every reward 1, lengths 3..T, scores N(0, 1) plus
    `planted` on every coordinate at positions ≥ `LATE` (only long members reach them)."""
    g = torch.Generator().manual_seed(seed)
    b = PROMPTS * POOL
    lengths = torch.randint(3, T + 1, (b,), generator=g)
    mask = (torch.arange(T)[None, :] < lengths[:, None]).double()
    returns = returns_to_go(outcome_token_rewards(torch.ones(b, dtype=torch.float64), mask), mask)
    group = torch.arange(PROMPTS).repeat_interleave(POOL)
    scores = torch.randn(b, T, K, generator=g, dtype=torch.float64)
    scores[:, LATE:] += planted
    w = 0.2 + torch.rand(b, T, generator=g, dtype=torch.float64)
    return returns, mask, group, scores * mask[..., None], {"proxy": w * mask}


def paired(planted: float):
    returns, mask, group, scores, energies = all_correct_pool(planted)
    specs = default_specs(["none", "mean", "otb"], zero_tail_split=True)
    return paired_estimates(
        returns, mask, group, scores, energies, specs=specs, aggregations=["token-sum"],
        group_sizes=[4], draws=200, bootstrap=400, seed=3,
    )  # fmt: skip


def test_the_split_adds_otb_without_the_tail_and_only_with_otb() -> None:
    labels = [s.label for s in default_specs(["none", "mean", "otb"], zero_tail_split=True)]
    assert labels == ["none", "mean", "otb", NO_ZERO_TAIL]
    assert NO_ZERO_TAIL not in [s.label for s in default_specs(["none", "mean"], [], True)]
    assert NO_ZERO_TAIL not in [s.label for s in default_specs(["none", "mean", "otb"])]


def test_in_all_correct_groups_the_tail_is_all_of_otbs_variance_and_mean_zero_on_noise() -> None:
    draws = paired(planted=0.0)
    (row,) = zero_tail_rows(draws, "token-sum")
    table = variance_table(draws).set_index("baseline")
    assert row["otb_variance"] == pytest.approx(table.at["otb", "variance"], rel=1e-12)
    assert row["no_zero_tail_variance"] == pytest.approx(table.at[NO_ZERO_TAIL, "variance"])
    # All rewards equal: the mean baseline gives 0, OTB without the tail ~0 (its ε), so OTB's
    # whole variance is its tail's.
    assert table.at["mean", "variance"] == 0.0
    assert row["no_zero_tail_variance"] < 1e-12 * row["otb_variance"]
    assert row["tail_variance"] == pytest.approx(row["otb_variance"], rel=1e-6)
    assert row["mean_zero"] and row["tail_mean_square_low"] <= 0 <= row["tail_mean_square_high"]


def test_a_mean_on_the_tail_tokens_is_found() -> None:
    (row,) = zero_tail_rows(paired(planted=1.0), "token-sum")
    assert not row["mean_zero"]
    assert 0 < row["tail_mean_square_low"] <= row["tail_mean_square"]
    assert row["tail_bias_z"] > 3


def test_tail_mean_square_is_unbiased_hand_cases() -> None:
    same = np.tile([3.0, 4.0], (5, 1))  # no spread: ‖d̄‖² = 25 exactly
    assert tail_mean_square(same) == 25.0
    d = np.array([[1.0, 0.0], [-1.0, 0.0]])  # m̄ = 0, tr Cov = 2: 0 − 2/2
    assert trace_variance(d) == 2.0 and tail_mean_square(d) == -1.0
    rng = np.random.default_rng(0)
    estimates = [tail_mean_square(rng.normal(0.5, 2.0, (10, 3))) for _ in range(4000)]
    assert np.mean(estimates) == pytest.approx(3 * 0.25, abs=0.05)  # ‖μ‖² = 0.75
