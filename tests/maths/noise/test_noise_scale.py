"""The split of a step's variance, |G|² and the noise scale against planted truth
(maths/noise/noise_scale.py, docs/theory.md §4.2)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from otb_diag.maths.noise.noise_scale import PromptMoments, decompose, noise_estimates

KEYS = ("within", "between", "total", "grad_sq", "noise_scale")


def moments_of(estimates: list[np.ndarray], pool_sizes, n: int) -> PromptMoments:
    """PromptMoments of per-prompt draws `estimates[p]: [R, k]`."""
    return PromptMoments(
        sums=np.stack([e.sum(0) for e in estimates]),
        squares=np.stack([np.square(e).sum(0) for e in estimates]),
        pool_sizes=np.asarray(pool_sizes, dtype=float),
        draws=len(estimates[0]),
        group_size=n,
    )


def planted_pools(seed: int, *, prompts=48, pool=32, n=8, draws=100, k=16, between=4.0,
                  noise=36.0, signal=2.25):  # fmt: skip
    """Gaussian pools with planted truth: prompt means `μ_p = G + b_p` (`tr Cov b = between`,
    `|G|² = signal`), responses `f = μ_p + ε` (`tr Cov ε = noise`), a pool of `pool` per prompt
    and `draws` groups of `n` drawn from it without replacement; a group's estimate is the mean
    of its responses (the `none` baseline, linear). Fresh groups of n would have
    `tr Cov = noise / n`."""
    rng = np.random.default_rng(seed)
    g = np.zeros(k)
    g[0] = math.sqrt(signal)
    mu = g + rng.normal(0, math.sqrt(between / k), (prompts, k))
    pools = mu[:, None] + rng.normal(0, math.sqrt(noise / k), (prompts, pool, k))
    estimates = [
        pools[p][rng.random((draws, pool)).argsort(1)[:, :n]].mean(1) for p in range(prompts)
    ]
    truth = {"within": noise / n, "between": between, "grad_sq": signal}
    truth["total"] = truth["within"] + truth["between"]
    truth["noise_scale"] = truth["total"] / signal if signal else math.inf
    return moments_of(estimates, [pool] * prompts, n), truth


@pytest.mark.parametrize("prompts", [16, 48])
def test_intervals_cover_the_planted_truth(prompts: int) -> None:
    """Each 95 % interval holds the truth in at least 90 % of 60 seeded repetitions."""
    reps = 60
    hits = dict.fromkeys(KEYS, 0)
    for seed in range(reps):
        moments, truth = planted_pools(seed, prompts=prompts)
        est = noise_estimates(moments)
        for key in KEYS:
            hits[key] += est[f"{key}_low"] <= truth[key] <= est[f"{key}_high"]
    assert {k: v / reps for k, v in hits.items()} == pytest.approx(
        dict.fromkeys(KEYS, 0.95), abs=0.05
    )


def test_estimates_are_unbiased_over_repetitions() -> None:
    """|G|², within and between average to the truth: each mean over 200 repetitions lies
    within 3 standard errors of it (the pool corrections included: pools of 32, groups of 8)."""
    reps = 200
    values = {k: [] for k in ("within", "between", "grad_sq")}
    for seed in range(reps):
        moments, truth = planted_pools(1000 + seed, prompts=16, draws=50)
        point = {k: float(v[0]) for k, v in decompose(moments).items()}
        for key in values:
            values[key].append(point[key])
    for key, xs in values.items():
        xs = np.asarray(xs)
        assert abs(xs.mean() - truth[key]) < 3 * xs.std(ddof=1) / math.sqrt(reps), key


def test_without_the_pool_correction_within_is_biased() -> None:
    """The (M−N)/M factor is needed: read as fresh samples, the pool draws come out low."""
    reps = 100
    corrected, naive = [], []
    for seed in range(reps):
        moments, truth = planted_pools(2000 + seed, prompts=16, draws=50)
        corrected.append(decompose(moments)["within"][0])
        fresh = PromptMoments(
            moments.sums, moments.squares, np.full(16, np.inf), moments.draws, moments.group_size
        )
        naive.append(decompose(fresh)["within"][0])
    assert np.mean(naive) == pytest.approx(truth["within"] * (32 - 8) / 32, rel=0.03)
    assert np.mean(corrected) == pytest.approx(truth["within"], rel=0.03)


def test_no_between_prompt_spread_gives_a_within_share_of_one() -> None:
    """Identical prompts: the between term averages 0 and the within share 1."""
    shares, betweens = [], []
    for seed in range(100):
        moments, truth = planted_pools(3000 + seed, prompts=32, between=0.0, draws=50)
        point = decompose(moments)
        shares.append(point["within_share"][0])
        betweens.append(point["between"][0])
    assert np.mean(shares) == pytest.approx(1.0, abs=0.03)
    assert abs(np.mean(betweens)) < 3 * np.std(betweens, ddof=1) / 10


def test_a_hand_computed_two_prompt_case() -> None:
    """P = 2, R = 2, k = 1. Prompt 1 draws 1 and 3, prompt 2 draws 4 and 8:
    m = (2, 6), u = (2, 8), S_m = ((2−4)² + (6−4)²)/1 = 8, m̄ = 4.
    Fresh samples (no pool): within = 5, between = 8 − (2/2 + 8/2)/2 = 5.5, total 10.5,
    |G|² = 4² − 8/2 = 12, B = 10.5/12 = 0.875, within share 5/10.5, SNR at 4 prompts 4/0.875.
    Pools of M = 4 with N = 2: within_p = u·4/2 = (4, 16), within 10; pool noise within_p·N/M
    = (2, 8); between = 8 − ((1 + 2) + (4 + 8))/2 = 0.5; total 10.5 again."""
    draws = [np.array([[1.0], [3.0]]), np.array([[4.0], [8.0]])]
    fresh = {k: float(v[0]) for k, v in decompose(moments_of(draws, [np.inf] * 2, 2), 4).items()}
    assert fresh["within"] == pytest.approx(5.0)
    assert fresh["between"] == pytest.approx(5.5)
    assert fresh["total"] == pytest.approx(10.5)
    assert fresh["grad_sq"] == pytest.approx(12.0)
    assert fresh["noise_scale"] == pytest.approx(0.875)
    assert fresh["within_share"] == pytest.approx(5 / 10.5)
    assert fresh["snr"] == pytest.approx(4 / 0.875)
    pooled = {k: float(v[0]) for k, v in decompose(moments_of(draws, [4, 4], 2)).items()}
    assert pooled["within"] == pytest.approx(10.0)
    assert pooled["between"] == pytest.approx(0.5)
    assert pooled["total"] == pytest.approx(10.5)


def test_leave_one_out_rows_equal_the_estimates_without_that_prompt() -> None:
    moments, _ = planted_pools(7, prompts=5, draws=20)
    jack = decompose(moments, 5, leave_one_out=True)  # SNR at the same 5 prompts throughout
    for i in range(5):
        keep = [p for p in range(5) if p != i]
        without = PromptMoments(
            moments.sums[keep], moments.squares[keep], moments.pool_sizes[keep],
            moments.draws, moments.group_size,
        )  # fmt: skip
        for key, value in decompose(without, 5).items():
            assert jack[key][i] == pytest.approx(value[0], rel=1e-9), key


def test_no_signal_leaves_the_knee_unresolved() -> None:
    """|G|² = 0 planted: its interval reaches 0, so no knee is claimed and B's interval is open."""
    unresolved = 0
    for seed in range(20):
        moments, _ = planted_pools(4000 + seed, prompts=16, signal=0.0)
        est = noise_estimates(moments)
        unresolved += not est["grad_sq_resolved"]
        if not est["grad_sq_resolved"]:
            assert est["noise_scale_high"] == math.inf
    assert unresolved >= 18


@pytest.mark.parametrize("scale", [1e-6, 1.0, 1e6])
@pytest.mark.parametrize("silent_first", [False, True])
def test_one_signal_among_silent_prompts_is_no_resolved_knee(scale, silent_first) -> None:
    """One prompt's draws vary, the others' are all 0 (their groups' rewards were equal): in
    exact arithmetic `‖m̄‖² = S_m/P`, so |G|² and every jackknife replicate are 0. The float
    difference is rounding and must not pass as a resolved |G|² with a zero-width interval (the
    CI crash of issue 24: a knee at ~1e17 prompts whose interval missed it)."""
    rng = np.random.default_rng(3)
    moving = scale * rng.normal(1.0, 2.0, (20, 32))
    draws = [moving, np.zeros((20, 32)), np.zeros((20, 32))]
    if silent_first:
        draws = draws[::-1]
    est = noise_estimates(moments_of(draws, [8, 8, 8], 4))
    assert est["grad_sq"] == 0.0 and est["grad_sq_low"] == 0.0 and est["grad_sq_high"] == 0.0
    assert not est["grad_sq_resolved"]
    assert est["noise_scale"] == math.inf and est["noise_scale_high"] == math.inf


@pytest.mark.parametrize("seed", range(30))
def test_every_interval_holds_its_estimate(seed) -> None:
    """On pools from pure noise to strong signal, with 3 to 20 prompts, every estimate with an
    interval lies inside it (NaN intervals aside: they say 'unknown')."""
    rng = np.random.default_rng(seed)
    moments, _ = planted_pools(
        seed, prompts=int(rng.integers(3, 21)), draws=int(rng.integers(3, 40)),
        signal=float(rng.choice([0.0, 1e-3, 2.25, 100.0])), between=float(rng.choice([0.0, 4.0])),
    )  # fmt: skip
    est = noise_estimates(moments)
    for name in ("within", "between", "total", "grad_sq", "within_share", "noise_scale", "snr"):
        low, point, high = est[f"{name}_low"], est[name], est[f"{name}_high"]
        if not (math.isnan(low) or math.isnan(high)):
            assert low <= point <= high, (name, low, point, high)
