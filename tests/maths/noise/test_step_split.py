"""One step's within/between split, |G|², noise scale and SNR from its groups
(maths/noise/step_split.py): a case by hand, unbiasedness on a linear-Gaussian model with
planted truth, and advantages at rounding level counted as 0."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from otb_diag.maths.estimators.otb import otb_baseline
from otb_diag.maths.noise.budget_stream import ONE_STEP_NOISE_SCALE
from otb_diag.maths.noise.noise_scale import ROUNDOFF_ULPS
from otb_diag.maths.noise.step_split import (
    response_contributions,
    step_split,
    without_rounding,
)


def test_a_step_by_hand() -> None:
    """P = 2 prompts of N = 2 responses, k = 2.

    Coordinate 1: prompt a has x = 1, 3 (m = 2, v = 2), prompt b 4, 6 (m = 5, v = 2).
    Coordinate 2: a has 0, 0, b has 2, 2 (m = 0 and 2, v = 0).
    within = mean_p Σ_j v_pj / N = (2 + 2)/2 / 2 = 1
    S_m = Σ_j Σ_p (m_pj − m̄_j)² / (P − 1) = (1.5² + 1.5²) + (1 + 1) = 6.5 = total
    between = 6.5 − 1 = 5.5; |G|² = ‖m̄‖² − S_m/P = 3.5² + 1² − 3.25 = 10."""
    x = torch.tensor([[1.0, 0.0], [4.0, 2.0], [3.0, 0.0], [6.0, 2.0]])
    group = torch.tensor([7, 9, 7, 9])  # ids need not be 0-based nor rows adjacent
    split = step_split(x, group)
    expected = {
        "within": 1.0,
        "between": 5.5,
        "total": 6.5,
        "grad_sq": 10.0,
        "within_share": 1 / 6.5,
        ONE_STEP_NOISE_SCALE: 0.65,
        "snr": 2 * 10 / 6.5,
    }
    assert split == pytest.approx(expected, rel=1e-12)


def test_contributions_by_hand() -> None:
    """token-sum: c = 1/B, so x_i = B · Σ_t (1/B) A_t s_t = Σ_t A_t s_t over generated tokens."""
    scores = torch.tensor([[[1.0], [2.0], [5.0]], [[3.0], [0.0], [0.0]]])  # [2, 3, 1]
    advantages = torch.tensor([[0.5, 0.5, 9.0], [-1.0, 0.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])  # the 9.0 is masked out
    x = response_contributions(scores, advantages, mask, "token-sum")
    assert x.tolist() == [[1.5], [-3.0]]
    # seq-mean-token-mean: c = 1/(B |y_i|), x_i = mean_t A_t s_t
    x = response_contributions(scores, advantages, mask, "seq-mean-token-mean")
    assert x[:, 0].tolist() == pytest.approx([0.75, -3.0], rel=1e-6)


def test_unequal_groups_are_refused() -> None:
    with pytest.raises(ValueError, match="same number"):
        step_split(torch.zeros(5, 2), torch.tensor([0, 0, 1, 1, 1]))


def test_unbiased_on_a_linear_gaussian_model() -> None:
    """Prompt means `μ_p = G + b_p` (`tr Cov b = between`, `|G|² = signal`), responses
    `x = μ_p + ε` (`tr Cov ε = noise`): truth within = noise / N, between, |G|² = signal. Over
    4000 steps the estimates' means lie within 4 standard errors (≤ 10 %) of the truth."""
    rng = np.random.default_rng(0)
    prompts, n, k, steps = 8, 4, 5, 4000
    between, noise, signal = 3.0, 20.0, 2.0
    truth = {"within": noise / n, "between": between, "total": noise / n + between}
    truth["grad_sq"] = signal
    g = np.zeros(k)
    g[0] = math.sqrt(signal)
    group = torch.arange(prompts).repeat(n)  # rows of a prompt spread over the step
    runs = {name: [] for name in truth}
    for _ in range(steps):
        mu = g + rng.normal(0, math.sqrt(between / k), (prompts, k))
        x = mu[group.numpy()] + rng.normal(0, math.sqrt(noise / k), (prompts * n, k))
        split = step_split(torch.from_numpy(x), group)
        for name in truth:
            runs[name].append(split[name])
    for name, value in truth.items():
        mean = float(np.mean(runs[name]))
        se = float(np.std(runs[name], ddof=1) / math.sqrt(steps))
        assert abs(mean - value) <= 4 * se, (name, mean, value, se)  # no bias resolved
        assert se <= 0.025 * value  # at a resolution of 10 %


def test_one_prompt_gives_no_between_terms() -> None:
    split = step_split(torch.randn(4, 3, dtype=torch.float64), torch.zeros(4, dtype=torch.long))
    assert split["within"] > 0
    assert math.isnan(split["between"]) and math.isnan(split["snr"])


def test_rounding_of_g_minus_b_counts_as_zero() -> None:
    """float32 (eps = 2⁻²³): `A = G − B` within 64 ulps of `|G|`, `|B|` is 0 (1, 4, 32 ulps); a
    real difference, one from `G = 0`, 128 ulps, and 1e-7 in float64 (far above its floor) stay."""
    assert ROUNDOFF_ULPS == 64
    returns = torch.tensor([1.0, 1.0, 0.0, 3.0, 1.0, 1.0])
    baseline = torch.tensor([1.0 - 2**-23, 0.9, 0.5, 3.0 + 2**-20, 1.0 - 2**-16, 1.0 - 2**-18])
    advantages = returns - baseline
    assert (advantages != 0).all()  # exact in float32: the rounding the floor is for
    kept = without_rounding(advantages, returns)
    assert kept.tolist() == [0.0, advantages[1].item(), -0.5, 0.0, 2**-16, 0.0]
    wide = torch.tensor([1e-7], dtype=torch.float64)
    assert without_rounding(wide, torch.ones(1, dtype=torch.float64)).tolist() == [1e-7]


def otb_step(rewards: list[float], n: int = 4, t: int = 6, seed: int = 0):
    """OTB's float32 advantages, returns, mask and group of a step whose groups have the given
    outcome rewards (one list entry per response, groups of n in order), every response of full
    length (no zero tail), energies random."""
    g = torch.Generator().manual_seed(seed)
    b = len(rewards)
    mask = torch.ones(b, t)
    returns = torch.tensor(rewards, dtype=torch.float32)[:, None].expand(b, t).contiguous()
    energy = torch.rand(b, t, generator=g).cumsum(-1)  # W_t
    group = torch.arange(b) // n
    return otb_baseline(returns, mask, group, energy), returns, mask, group


def test_equal_rewards_give_no_signal_under_otb() -> None:
    """Every group's rewards equal: OTB's float32 advantages are rounding (B = Σ W R / Σ W an
    ulp off R), so without them the split is 0 and its ratios undefined: exactly the split of
    exact zero advantages, what `mean` or a trainer's grpo give such a step."""
    rewards = [0.7] * 4 + [1.3] * 4 + [3.0] * 4
    advantages, returns, mask, group = otb_step(rewards)
    assert advantages.abs().max() > 0  # the rounding is there
    scores = torch.randn(len(rewards), 6, 3, generator=torch.Generator().manual_seed(1))
    x = response_contributions(scores, without_rounding(advantages, returns), mask, "token-mean")
    split = step_split(x, group)
    silent = step_split(torch.zeros_like(x), group)  # exact zero advantages
    assert split["within"] == split["between"] == split["grad_sq"] == split["total"] == 0.0
    assert split[ONE_STEP_NOISE_SCALE] == math.inf
    for name in ("within_share", "snr"):
        assert math.isnan(split[name]) and math.isnan(silent[name])
    assert {k: v for k, v in split.items() if k not in ("within_share", "snr")} == {
        k: v for k, v in silent.items() if k not in ("within_share", "snr")
    }


def test_a_moving_group_keeps_its_advantages() -> None:
    """One group with mixed rewards among equal ones: its advantages pass untouched, the equal
    groups' rounding goes, and within, between, total are the raw advantages' to rounding.
    `|G|²` is exactly 0, as the algebra has it for one prompt with a signal among silent ones
    (`‖m̄‖² = S_m / P = ‖m_1‖² / P²`); the raw advantages' rounding gave it 1.9e-9 here, a noise
    scale of 7e6 prompts."""
    rewards = [0.0, 1.0, 1.0, 0.0] + [1.3] * 4 + [3.0] * 4
    advantages, returns, mask, group = otb_step(rewards, seed=2)
    kept = without_rounding(advantages, returns)
    assert torch.equal(kept[:4], advantages[:4]) and (kept[:4] != 0).all()
    assert (kept[4:] == 0).all()
    scores = torch.randn(len(rewards), 6, 3, generator=torch.Generator().manual_seed(3))
    split = step_split(response_contributions(scores, kept, mask, "token-mean"), group)
    raw = step_split(response_contributions(scores, advantages, mask, "token-mean"), group)
    assert split["within"] > 0
    for name in ("within", "between", "total", "within_share"):
        assert split[name] == pytest.approx(raw[name], rel=1e-6), name
    assert split["grad_sq"] == 0.0 and split[ONE_STEP_NOISE_SCALE] == math.inf
