"""The noise scale pooled over training steps (`maths/noise/pooling.py`), on planted truth:
simulated steps whose responses are Gaussian score contributions with known `within`,
`between` and `|G|²`, each split by the very `step_split` the trainers log, `|G|²` drifting
slowly. The pooled interval covers the truth about 95 % of the time, narrows as 1/√steps, and a
stream without signal never claims a knee when its estimates are exactly 0 (and at about the
interval's 2.5 % when they are noise about a true 0); the moments are checked against direct
weighted sums and a hand-computed case."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from otb_diag.maths.noise.pooling import (
    EmaPool,
    Pooled,
    WindowPool,
    ema_step,
    moments_of,
    pooled_estimates,
    unit_share,
)
from otb_diag.maths.noise.step_split import step_split

P, N, K, L = 8, 4, 16, 20.0  # prompts, responses a prompt, score dimension, tokens a response
WITHIN, BETWEEN = 3.0, 1.0  # tr Σ = 4


def simulated_step(rng: np.random.Generator, grad_sq: float) -> tuple[float, ...]:
    """One step's tuple (`COLUMNS`): P prompts of N responses, `x = m_p + e`, `m_p = G + b_p`,
    `tr Cov b = BETWEEN`, `tr Cov e = N · WITHIN` (so a prompt's estimate, the mean of its N,
    varies by WITHIN), `|G|² = grad_sq`; split by `step_split`."""
    g = np.full(K, math.sqrt(grad_sq / K))
    means = g + rng.normal(0, math.sqrt(BETWEEN / K), (P, K))
    x = np.repeat(means, N, 0) + rng.normal(0, math.sqrt(N * WITHIN / K), (P * N, K))
    split = step_split(torch.from_numpy(x), torch.arange(P).repeat_interleave(N))
    return (split["total"], split["grad_sq"], split["within"], P, N, L)


def pooled_whole(steps: list[tuple[float, ...]]) -> Pooled:
    """What `WindowPool(len(steps)).add` returns at the last of `steps`, computed once: a stream
    whose estimates are read at its end only needs none before (`pooled_estimates` costs what
    a step's simulation does)."""
    pool = WindowPool(len(steps))
    pool.rows.extend(steps[:-1])
    return pool.add(steps[-1])


def drift(s: int, steps: int) -> float:
    """The planted |G|² at step s: 0.5, rising by half over the stream (B from 8 to 5.3)."""
    return 0.5 * (1 + 0.5 * s / steps)


@pytest.mark.slow  # 300 simulated streams
def test_the_window_covers_the_drifting_truth_about_95_percent() -> None:
    """300 streams of 40 steps, each pooled whole. The truth of a window is its mean tr Σ over
    its mean |G|² (the pooled quantity, module docstring); |G|²'s is its mean, the within
    share WITHIN / tr Σ."""
    rng = np.random.default_rng(0)
    steps, reps = 40, 300
    mean_g = float(np.mean([drift(s, steps) for s in range(steps)]))
    truth = {
        "noise_scale": (WITHIN + BETWEEN) / mean_g,
        "grad_sq": mean_g,
        "within_share": WITHIN / (WITHIN + BETWEEN),
        "snr": P * mean_g / (WITHIN + BETWEEN),
    }
    hits = dict.fromkeys(truth, 0)
    for _ in range(reps):
        found = pooled_whole([simulated_step(rng, drift(s, steps)) for s in range(steps)])
        for name, value in truth.items():
            hits[name] += getattr(found, f"{name}_low") <= value <= getattr(found, f"{name}_high")
    for name in truth:
        assert 0.90 <= hits[name] / reps <= 0.99, (name, hits[name] / reps)


@pytest.mark.slow  # 200 simulated streams
def test_the_ema_follows_a_drift_and_covers_its_weighted_truth() -> None:
    """EMA at β = 0.9 over 60 steps: its truth is the β-weighted mean tr Σ over the β-weighted
    mean |G|², which lies near the recent B, not the stream's average."""
    rng = np.random.default_rng(1)
    steps, reps, beta = 60, 200, 0.9
    weights = beta ** np.arange(steps)[::-1]  # the last step weighs 1
    g = np.array([drift(s, steps) for s in range(steps)])
    truth = (WITHIN + BETWEEN) / float((weights * g).sum() / weights.sum())
    hits = 0
    for _ in range(reps):
        pool = EmaPool(beta)
        for s in range(steps):
            found = pool.add(simulated_step(rng, drift(s, steps)))
        hits += found.noise_scale_low <= truth <= found.noise_scale_high
    assert 0.90 <= hits / reps <= 0.99
    assert truth < (WITHIN + BETWEEN) / g.mean()  # the drift raised |G|²: recent B is lower


@pytest.mark.slow  # simulated streams
def test_the_interval_narrows_as_one_over_root_steps() -> None:
    """A stationary stream: |G|²'s interval at 64 steps is half that at 16 (±15 %)."""
    rng = np.random.default_rng(2)

    def mean_width(steps: int) -> float:
        widths = []
        for _ in range(100):
            found = pooled_whole([simulated_step(rng, 0.5) for _ in range(steps)])
            widths.append(found.grad_sq_high - found.grad_sq_low)
        return float(np.mean(widths))

    assert mean_width(16) / mean_width(64) == pytest.approx(2.0, rel=0.15)


@pytest.mark.slow  # 300 simulated streams
def test_no_signal_never_claims_a_knee() -> None:
    """Exact zeros (every group's rewards equal: the split is 0, `step_split.py`) never claim a
    knee and give no bound; noise about a true |G|² = 0 claims one only as often as the 95 %
    interval's lower tail allows (2.5 %; ≤ 6 % of 300 streams), and otherwise says it is not
    resolved, with B's interval open above."""
    pool = WindowPool(40)
    for _ in range(40):
        found = pool.add((0.0, 0.0, 0.0, P, N, L))
    assert not found.resolved
    assert math.isinf(found.noise_scale) and math.isinf(found.noise_scale_high)
    said = found.sentence("mean", 40)
    assert "not resolved after 40 steps (320 prompts); no signal measurable at all" in said
    assert said.endswith(f"; you train with {P:.0f} prompts a step")  # the count has its unit
    assert math.isinf(found.noise_scale_low)  # |G|² = tr Σ = 0: no finite bound either
    rng = np.random.default_rng(3)
    claims = 0
    for _ in range(300):
        found = pooled_whole([simulated_step(rng, 0.0) for _ in range(40)])
        claims += found.resolved
        if not found.resolved:
            assert math.isinf(found.noise_scale_high)
            low = found.noise_scale_low
            bound = (
                f"the knee is at least {low:.3g} prompts"
                if math.isfinite(low)
                else ("no signal measurable at all (|G|² ≤ 0 across its interval)")
            )  # the whole interval of 1/B below 0: no finite bound
            assert bound in found.sentence("mean", 40)
    assert claims / 300 <= 0.06


def test_a_hand_computed_window() -> None:
    """Three steps: B = mean t / mean g, |G|²'s interval ḡ ± t_{0.975,2} sd/√3, the knee in
    responses and tokens B·N·L̄, the within share w̄ / t̄."""
    rows = [(4.0, 1.0, 2.0, 8, 4, 10.0), (6.0, 2.0, 3.0, 8, 4, 20.0), (5.0, 0.0, 4.0, 8, 4, 30.0)]
    pool = WindowPool(3)
    for row in rows:
        found = pool.add(row)
    assert found.noise_scale == pytest.approx(5.0 / 1.0)
    assert found.within_share == pytest.approx(3.0 / 5.0)
    half = 4.302652729911275 * 1.0 / math.sqrt(3)  # t_{0.975, 2} · sd(1, 2, 0) / √3
    assert (found.grad_sq_low, found.grad_sq_high) == pytest.approx((1 - half, 1 + half))
    assert found.knee_responses == pytest.approx(5.0 * 4)
    assert found.knee_responses_low == pytest.approx(found.noise_scale_low * 4)
    assert found.knee_tokens_high == pytest.approx(found.noise_scale_high * 4 * 20.0)
    assert found.knee_tokens == pytest.approx(5.0 * 4 * 20.0)
    assert found.snr == pytest.approx(8 / 5.0)
    assert (found.steps, found.prompts) == (3, pytest.approx(24.0))
    assert not found.resolved  # 1 − 2.48 < 0
    # 1/B's delta-method interval: se² = Var(g − r t) / (3 t̄²), r = 1/5.
    d = np.array([1 - 4 / 5, 2 - 6 / 5, 0 - 5 / 5])
    se = math.sqrt(d.var(ddof=1) / 3) / 5.0
    assert found.noise_scale_low == pytest.approx(1 / (0.2 + 4.302652729911275 * se))
    # A knee controller's run samples P = 8 a step and updates with more: the sentence says both.
    assert found.sentence("grpo", 3).endswith("; you train with 8 prompts a step")
    assert found.sentence("grpo", 3, per_update=8.0).endswith("; you train with 8 prompts a step")
    controlled = found.sentence("grpo", 3, per_update=32.0)
    assert controlled.endswith(
        "; you sample 8 prompts a step and update with 32 (the knee controller)"
    )


def test_the_window_keeps_only_its_last_steps() -> None:
    rng = np.random.default_rng(4)
    rows = [simulated_step(rng, 0.5) for _ in range(12)]
    pool = WindowPool(5)
    for row in rows:
        found = pool.add(row)
    assert found == pooled_estimates(moments_of(np.array(rows[-5:])))
    assert len(pool.rows) == 5


def test_ema_moments_equal_direct_weighted_sums() -> None:
    """West's update against Σ β^age x and Σ β^age (x − x̄)(y − ȳ) computed directly."""
    rng = np.random.default_rng(5)
    rows = rng.normal(size=(30, 6)) * [1, 0.1, 2, 0, 0, 5] + [4, 0.5, 3, 8, 4, 20]
    beta = 0.8
    m = None
    for row in rows:
        m = ema_step(m, row, beta)
    w = beta ** np.arange(len(rows))[::-1]
    mean = (w[:, None] * rows).sum(0) / w.sum()
    centred = rows - mean
    assert m.weight == pytest.approx(w.sum())
    assert m.weight_sq == pytest.approx(np.square(w).sum())
    np.testing.assert_allclose(m.mean, mean, rtol=1e-12)
    np.testing.assert_allclose(
        m.comoment, (w[:, None, None] * centred[:, :, None] * centred[:, None, :]).sum(0),
        rtol=1e-10, atol=1e-12,
    )  # fmt: skip
    assert m.steps == 30


def test_one_step_has_no_interval_and_totals_only_have_no_share() -> None:
    one = WindowPool(10).add((4.0, 1.0, 3.0, 8, 4, 10.0))
    assert one.noise_scale == 4.0 and not one.resolved
    assert (one.grad_sq_low, one.grad_sq_high) == (-math.inf, math.inf)
    pool = WindowPool(10)
    for t, g in ((4.0, 1.0), (6.0, 2.0), (5.0, 1.5)):
        found = pool.add((t, g, math.nan, 8, 4, 10.0))
    assert found.noise_scale == pytest.approx(5.0 / 1.5)
    assert all(math.isnan(x) for x in (found.within_share, found.within_share_low))
    assert math.isfinite(found.noise_scale_low)


def test_a_negative_pooled_trace_claims_no_knee() -> None:
    """The two-batch tr Σ (no within) may be negative at a step and pool below 0: with |G|²
    resolved, B = t̄ / ḡ < 0 ("the knee is ~-3.8 prompts") is no knee, and the sentence says the
    noise was not measured."""
    rng = np.random.default_rng(0)
    pool = WindowPool(100)
    for _ in range(40):
        found = pool.add((-2 + rng.normal(0, 0.5), 0.5 + rng.normal(0, 0.1), math.nan, P, N, L))
    assert found.grad_sq_low > 0 and found.total < 0 and found.noise_scale < 0
    assert not found.resolved and found.metrics()["resolved"] == 0.0
    said = found.sentence("params", 40)
    assert "the knee is ~" not in said
    assert f"the pooled tr Σ is {found.total:.3g} after 40 steps (320 prompts): no noise" in said


def test_a_pooled_share_above_one_is_clipped_with_its_interval() -> None:
    """Three steps whose within terms exceed their totals (the between-prompt estimate below
    0): w̄ / t̄ = 3.3 / 3.0 = 1.1, which no share can be; the pooled share reads 1 and its
    interval lies in [0, 1], holding it. The same steps with a within under the total keep
    their share as w̄ / t̄ (0.6)."""
    above = [(1.0, 0.5, 1.2, 8, 4, 10.0), (1.2, 0.4, 1.1, 8, 4, 10.0), (0.8, 0.6, 1.0, 8, 4, 10.0)]
    pool = WindowPool(3)
    for row in above:
        found = pool.add(row)
    raw = sum(r[2] for r in above) / sum(r[0] for r in above)
    assert raw == pytest.approx(1.1)
    assert found.within_share == 1.0 and found.within_share_high == 1.0
    assert 0.0 <= found.within_share_low < 1.0
    below = WindowPool(3)
    for t, g, _, *shape in above:
        kept = below.add((t, g, 0.6 * t, *shape))
    assert kept.within_share == pytest.approx(0.6) and kept.within_share_high < 1.0


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.floats(-1e6, 1e6) | st.sampled_from([math.inf, -math.inf, math.nan]), max_size=3),
    st.floats(0.0, 1.0),
)
def test_clipping_a_share_never_moves_it_from_a_truth_in_zero_to_one(values, truth) -> None:
    """For any estimate x and any truth θ in [0, 1]: |clip(x) − θ| ≤ |x − θ|, so an interval
    that held θ still holds it once clipped; NaN stays NaN."""
    for x, clipped in zip(values, unit_share(*values), strict=True):
        if math.isnan(x):
            assert math.isnan(clipped)
        else:
            assert 0.0 <= clipped <= 1.0
            assert abs(clipped - truth) <= abs(x - truth)


def test_a_window_whose_ratios_agree_has_a_point_interval_not_a_round_offs() -> None:
    """A step with noise beside one with all-equal rewards (within 0, its total 0 to a
    round-off of ±1e-13, as the TRL toy's step 2 logged it): the two steps' within/total ratios
    agree, so the delta method's form C_ww − 2 r C_wt + r² C_tt is 0, and its three terms
    cancel to a round-off of either sign. Every such window reads the share's interval as the
    point (to 1e-6 of it), never [0, 1] (the sign of the round-off read as no spread known):
    the ZeRO-3 run read the point where its DDP twin read [0, 1]."""
    first = (0.04359124599329631, -0.004318185391264721, 0.007860239250719669, 3, 4, 4.0)
    for t2 in np.linspace(-1e-13, 1e-13, 201):
        found = pooled_estimates(moments_of(np.array([first, (t2, 0.0, 0.0, 3, 4, 4.0)])))
        share = found.within_share
        assert share == pytest.approx(first[2] / first[0], rel=1e-9), t2
        ends = (found.within_share_low, found.within_share_high)
        assert ends == pytest.approx((share, share), rel=1e-6), t2
