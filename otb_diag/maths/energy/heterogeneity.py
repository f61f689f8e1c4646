"""How differently the responses of one group accumulate energy (paper figures 3 and 4).

Inputs are per-response cumulative energy paths `W` (docs/theory.md §2: `W_t = Σ_{j≤t} mask_j·w_j`),
one 1-D array per group member, each as long as its response. A finished response keeps its
total: for t beyond its length its W is frozen at `W_T`, which is how it enters later rankings.
A response with no token (an aborted generation) has no path and no energy to rank: it is left
out of its group's heterogeneity."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

QUANTILES = (0.25, 0.50, 0.75)
# The statistics `group_heterogeneity` returns, in order.
HETEROGENEITY = (
    "energy_cv",
    "energy_max_min_ratio",
    *(f"kendall_tau_{round(q * 100)}" for q in QUANTILES),
    "rank_changes",
)
# Energies closer than this (relative) are one tie: fp32 accumulation order alone moves W by
# ~1e-7 relative, and a forward pass over a differently padded batch (another --batch-tokens,
# another share of groups under torchrun) by up to ~1e-5 (measured 7.6e-6 on w); two responses
# with the same prefix must not "change rank" through it.
TIE_RTOL = 1e-4


def quantile_positions(lengths: Sequence[int], quantiles: Sequence[float] = QUANTILES) -> list[int]:
    """0-based positions at the given fractions of the shortest member's length."""
    shortest = min(lengths)
    return [max(0, min(shortest - 1, math.ceil(q * shortest) - 1)) for q in quantiles]


def frozen_paths(paths: Sequence[np.ndarray]) -> np.ndarray:
    """`[N, T_max]` matrix of the paths, each padded with its own final value."""
    t_max = max(len(p) for p in paths)
    return np.stack([np.pad(p, (0, t_max - len(p)), mode="edge") for p in paths])


def tie_keys(values: np.ndarray, rtol: float = TIE_RTOL) -> np.ndarray:
    """Integer rank keys of `values` along axis 0 (`[N]` or `[N, T]`), equal for near-ties.

    Sorted neighbours closer than `rtol` times their magnitude share one key, so the keys are
    unchanged by a positive rescaling and by last-bit noise."""
    idx = np.argsort(values, axis=0, kind="stable")
    ordered = np.take_along_axis(values, idx, axis=0)
    scale = np.maximum(np.abs(ordered[1:]), np.abs(ordered[:-1]))
    gaps = np.diff(ordered, axis=0) > rtol * scale
    first = np.zeros((1, *values.shape[1:]), np.int64)
    sorted_keys = np.concatenate([first, np.cumsum(gaps, axis=0)])
    keys = np.empty_like(sorted_keys)
    np.put_along_axis(keys, idx, sorted_keys, axis=0)
    return keys


def kendall_tau_b(x: np.ndarray, y: np.ndarray) -> float:
    """Kendall's τ-b of two `[N]` rankings (scipy's `kendalltau` default, without its per-call
    overhead, which dominated groups of 16): over the pairs i < j, with s = sign(x_i - x_j) and
    u = sign(y_i - y_j), τ_b = Σ s·u / sqrt(Σ s² · Σ u²); NaN when either ranking is constant."""
    s = np.sign(x[:, None] - x[None, :])  # [N, N]; the pair (i, j) and (j, i) count alike
    u = np.sign(y[:, None] - y[None, :])
    denominator = math.sqrt(float((s * s).sum()) * float((u * u).sum()))
    return float((s * u).sum()) / denominator if denominator > 0 else math.nan


def rank_changes(paths: Sequence[np.ndarray]) -> int:
    """Number of steps t at which the ordering of the members by W_t differs from that at t−1.

    Orderings use a stable argsort of tie keys (`tie_keys`), so ties, exact or within
    `TIE_RTOL`, keep input order and do not count as changes."""
    order = np.argsort(tie_keys(frozen_paths(paths)), axis=0, kind="stable")  # [N, T_max]
    return int(np.any(order[:, 1:] != order[:, :-1], axis=0).sum())


def group_heterogeneity(paths: Sequence[np.ndarray]) -> dict[str, float]:
    """Energy heterogeneity of one group.

    Returns the coefficient of variation (population std / mean) and the max/min ratio of the
    sequence energies W(τ_i) = W_T; Kendall τ between the ranking by W_t at 25/50/75 % of the
    shortest member's length and the ranking by total energy (1: the early ranking already
    predicts the final one; low or negative: rankings reshuffle along t, which a sequence-level
    baseline cannot see); and the number of rank changes along t. Rankings treat energies
    within `TIE_RTOL` as ties (`tie_keys`). NaN where undefined
    (a group of one, zero mean energy, constant rankings, no member with a token)."""
    paths = [p for p in paths if len(p)]  # an empty response has no W_t to rank
    if not paths:
        return dict.fromkeys(HETEROGENEITY, math.nan)
    totals = np.array([float(p[-1]) for p in paths])
    total_keys = tie_keys(totals)
    mean = totals.mean()
    out: dict[str, float] = {
        "energy_cv": float(totals.std() / mean) if mean > 0 else math.nan,
        "energy_max_min_ratio": float(totals.max() / totals.min())
        if totals.min() > 0
        else math.nan,
    }
    positions = quantile_positions([len(p) for p in paths])
    for q, pos in zip(QUANTILES, positions, strict=True):
        early = tie_keys(np.array([float(p[pos]) for p in paths]))
        tau = kendall_tau_b(early, total_keys) if len(paths) > 1 else math.nan
        out[f"kendall_tau_{round(q * 100)}"] = float(tau)
    out["rank_changes"] = float(rank_changes(paths))
    return out
