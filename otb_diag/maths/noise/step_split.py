"""One training step's gradient noise split between and within its prompts, its signal and its
noise scale, from the step's own groups (docs/theory.md §4.1): the live counterpart of
`noise_scale.py`, which estimates the same terms from paired draws out of larger pools.

A step of P prompts with N responses each estimates the gradient by

    ĝ = Σ_i Σ_t a_{i,t} s_{i,t}          a = c · A: the trainer's aggregation weights c
                                          (`maths/aggregation.py`) times a baseline's advantages
      = (1/P) Σ_p ĝ_p,    ĝ_p = (1/N) Σ_{i∈p} x_i,    x_i = P N Σ_t a_{i,t} s_{i,t}

so response i contributes `x_i` (`response_contributions`; `ĝ_p` is `paired_draws.py`'s
per-prompt estimate). Importance weights ρ reach `a` as they reach variance-compare's `c · A`
(`paired_draws.py:draw_estimates`): through the advantages of the one estimator (OTB's baseline
weights `w ρ²`), with no factor ρ of their own. With `m_p = ĝ_p` and
`v_p = Σ_{i∈p} ‖x_i − m_p‖² / (N − 1)`:

    within       = mean_p v_p / N          tr Cov(ĝ_p | p), averaged over the prompts
    S_m          = Σ_p ‖m_p − m̄‖² / (P − 1)
    between      = S_m − within            E S_m = between + within
    total        = within + between = S_m  tr Σ; the step's own variance is total / P
    |G|²         = ‖m̄‖² − S_m / P           unbiased: E‖m̄‖² = |G|² + tr Σ / P
    within_share = within / total,  one_step_noise_scale = total / |G|²,  snr = P · |G|² / total

(the noise scale named for the one step it rests on, `budget_stream.py`'s `ONE_STEP_NOISE_SCALE`:
the run's knee is the noise scale pooled over its steps, `pooling.py`).

These are `noise_scale.decompose`'s estimates, the N responses of a prompt taken as N draws of a
one-response estimate from an infinite pool (fresh samples: no pool correction), its `within` then
divided by N; the rounding floor of `|G|²` is decompose's. An advantage `A = G − B` within
`ROUNDOFF_ULPS` ulps of `|G|` and `|B|` (`without_rounding`) is the rounding of that difference,
not signal, and counts as 0: a step whose groups all have equal rewards then gives `within =
between = |G|² = 0` under OTB (`B = Σ W G / (Σ W + ε)`, an ulp off `G`) as under `mean`, its ratios
undefined (`one_step_noise_scale` inf, `within_share` and `snr` 0/0), as decompose treats an
unresolved `|G|²`. Two advantages of OTB's there are not rounding and stay: `A = G` on the zero
tail of a group's strictly longest member (`B = 0`), and `A = G ε / (Σ W + ε)` where the group's
`Σ W_t` is small enough for verl's `ε = 1e-8` to count (1e-4 of `G` at `Σ W_t = 1e-4`, a first
token every response is near-certain of). `within` is exact for a baseline independent of the
group's rewards (`none`: the `x_i` of a prompt are independent draws) and first-order for the group
baselines (mean, grpo, OTB), whose baseline ties a group's `x_i` together, as for
`noise_scale.py`'s pool corrections. Every term is a trace, computed in the projected space of the
scores (`E[(Sx)·(Sy)] = x·y`); the projection cancels in the ratios. Prompts are the samples of
`between` and `|G|²`: with the few prompts of one step they are noisy, so read them over many
steps.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from otb_diag.maths.aggregation import aggregation_weights
from otb_diag.maths.noise.budget_stream import ONE_STEP_NOISE_SCALE, STEP_SHAPE
from otb_diag.maths.noise.noise_scale import (
    ROUNDOFF_ULPS,
    PromptMoments,
    decompose,
    signal_and_noise,
)

# The split's per-token score vectors, wherever a step's split is formed (TRL's and verl's live
# diagnostics, `otb-diag train`): head-mode sketches of this dimension, under this seed, so that
# every step and every trainer project the same way.
SPLIT_K, SPLIT_SEED = 64, 0
# What `step_split` returns, in order (`noise_scale.decompose`'s names but the noise scale's).
SPLIT = ("within", "between", "total", "grad_sq", "within_share", ONE_STEP_NOISE_SCALE, "snr")


def without_rounding(advantages: Tensor, returns: Tensor) -> Tensor:
    """`advantages` `[B, T]` with 0 where `|A| ≤ ROUNDOFF_ULPS · eps · max(|G|, |B|)`, `B = G − A`
    the baseline, eps that of the advantages' dtype; returns: `[B, T]` the `G_t` they came from.

    `A = G − B` cancels two terms: a baseline equal to the rewards in exact arithmetic (OTB's
    `Σ_j W_j G_j / Σ_j W_j` over a group of equal `G`) comes out a few ulps off `G`, and that
    rounding would pass as a signal of relative size 1e-7 with ratios of any value. The floor is
    `noise_scale.decompose`'s for `|G|²`, in the advantages' precision. grpo divides such a
    difference by the group's std, which lifts its rounding above any floor where the group's
    mean is inexact (7 rewards of 0.1: |A| ≈ 0.007 at ε = 1e-6); those are the advantages the
    trainer computes, and they stay."""
    baseline = returns - advantages  # B_t
    magnitude = torch.maximum(returns.abs(), baseline.abs())
    floor = ROUNDOFF_ULPS * torch.finfo(advantages.dtype).eps * magnitude
    return torch.where(advantages.abs() <= floor, 0.0, advantages)


def response_contributions(
    scores: Tensor, advantages: Tensor, mask: Tensor, aggregation: str
) -> Tensor:
    """`x_i = P N Σ_t c_{i,t} A_{i,t} s_{i,t}` `[B, k]` float64 (module docstring; P N = B).

    scores: `[B, T, k]` projected per-token scores; advantages: `[B, T]` one baseline's, from
    the one estimator; mask: `[B, T]` generated tokens; aggregation: a registered name."""
    weights = aggregation_weights(aggregation, mask).double()  # c: [B, T], 0 off the mask
    coef = len(mask) * weights * advantages.double()  # B · c · A
    return torch.einsum("bt,btk->bk", coef, scores.double())


def step_split(contributions: Tensor, group: Tensor) -> dict[str, float]:
    """The estimates of `SPLIT` (module docstring) for one step, `snr` at the step's P.

    contributions: `[B, k]` `x_i` of `response_contributions`; group: `[B]` prompt ids, every
    prompt with the same number N ≥ 2 of responses (whole groups). With fewer than 2 prompts the
    between-prompt terms are NaN."""
    x = contributions.double().cpu().numpy()
    ids = group.cpu().numpy()
    _, index, sizes = np.unique(ids, return_inverse=True, return_counts=True)
    if sizes.min() < 2 or sizes.min() != sizes.max():
        raise ValueError(f"every prompt needs the same number ≥ 2 of responses; got {sizes}")
    p, n = len(sizes), int(sizes[0])
    sums, squares = np.zeros((p, x.shape[1])), np.zeros((p, x.shape[1]))
    np.add.at(sums, index, x)  # Σ_{i∈p} x_i
    np.add.at(squares, index, np.square(x))  # Σ_{i∈p} x_i² per coordinate
    one_response = PromptMoments(sums, squares, np.full(p, np.inf), draws=n, group_size=1)
    with np.errstate(divide="ignore", invalid="ignore"):  # P = 1: no spread between prompts
        terms = decompose(one_response)  # within of one response; between, |G|² as above
        estimates = signal_and_noise(terms["within"] / n, terms["between"], terms["grad_sq"], p)
    estimates[ONE_STEP_NOISE_SCALE] = estimates["noise_scale"]  # the name says: one step's
    return {name: float(estimates[name][0]) for name in SPLIT}


def step_shape(mask: Tensor, group: Tensor) -> dict[str, float]:
    """The step's prompts P, responses a prompt N and mean generated tokens a response L̄, under
    `budget_stream.STEP_SHAPE`'s names: what pooling the split over steps needs beside it.

    mask: `[B, T]` generated tokens; group: `[B]` prompt ids (whole groups)."""
    rows, prompts = len(group), len(torch.unique(group))
    shape = (prompts, rows / prompts, float(mask.sum()) / rows)
    return {k: float(v) for k, v in zip(STEP_SHAPE, shape, strict=True)}
