"""Proxy fidelity: how well the logit-gradient proxy `w_t` tracks the true per-token squared
gradient norm `‖∇_θ log p_t‖²` (docs/theory.md §2: an assumption to measure, not a theorem)."""

from __future__ import annotations

import math

import numpy as np
from scipy import stats
from torch import Tensor


def correlations(x: np.ndarray | Tensor, y: np.ndarray | Tensor) -> dict[str, float]:
    """Spearman and Pearson correlation of two equal-length samples, and their count n.

    NaN (not a warning) when n < 2 or either sample is constant.
    """
    x = np.asarray(x, dtype=np.float64).ravel()
    y = np.asarray(y, dtype=np.float64).ravel()
    if len(x) < 2 or np.ptp(x) == 0 or np.ptp(y) == 0:
        return {"spearman": math.nan, "pearson": math.nan, "n": len(x)}
    return {
        "spearman": float(stats.spearmanr(x, y).statistic),
        "pearson": float(stats.pearsonr(x, y).statistic),
        "n": len(x),
    }


def fidelity(w: Tensor, true_sq_norm: Tensor, mask: Tensor) -> dict[str, float]:
    """How well the proxy `w_t` tracks the true per-token `||grad log p_t||^2`.

    w, true_sq_norm, mask: `[B, T]`. Token level: over generated tokens (mask 1). Sequence
    level: `sum_t mask_t w_t` against `sum_t mask_t ||grad log p_t||^2` over responses with a
    generated token (the additive energies; the true `||grad log pi(tau)||^2` also has cross
    terms between tokens, which per-token norms cannot give).
    """
    keep = mask.bool()
    token = correlations(w[keep].cpu(), true_sq_norm[keep].cpu())
    nonempty = keep.any(-1)
    sequence = correlations(
        (w * mask).sum(-1)[nonempty].cpu(), (true_sq_norm * mask).sum(-1)[nonempty].cpu()
    )
    return {
        "token_spearman": token["spearman"],
        "token_pearson": token["pearson"],
        "tokens": token["n"],
        "sequence_spearman": sequence["spearman"],
        "sequence_pearson": sequence["pearson"],
        "sequences": sequence["n"],
    }
