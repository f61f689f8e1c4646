"""Variances read off subsets of the projected coordinates (docs/theory.md §4): per parameter block,
and per sub-sketch to measure the projection's own error.

Blocks: with a block-diagonal projection `u_t = ⊕_b P_b s_{t,b}` the coordinates of block b
carry `ĝ_b`, and `tr Cov(ĝ) = Σ_b tr Cov(ĝ_b)`: the trace variance over the block's coordinates
is its variance, and the blocks' variances sum to the total exactly (same draws).

Projection error: split every block's `k_b` coordinates into S interleaved sub-sketches (every
S-th coordinate), each an independent Gaussian projection of dimension `k/S`. Rescaled by
`K / |sub-sketch|`, each gives its own unbiased estimate `V_s` of the same (unprojected)
variance on the same draws, and the full estimate is their mean. So the spread across
sub-sketches is projection error alone (no draw noise), and the relative error of the full
estimate is `std_s(V_s) / mean_s(V_s) / √S`. For a rank-one covariance it is `√(2/k)`; spread
over many directions it is smaller. Ratios between baselines (`V_otb / V_mean`) use the same
projection and err less; their error is measured the same way.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import pandas as pd

from otb_diag.maths.variance.intervals import REFERENCE, trace_variance
from otb_diag.maths.variance.paired_draws import PairedDraws, variance_table

DEFAULT_SUBSKETCHES = 8


def block_tables(paired: PairedDraws, blocks: Sequence[tuple[str, int, int]]) -> pd.DataFrame:
    """`variance_table` of every block `(name, offset, k_b)`, with a leading `block` column
    (variance, interval, ratio to mean, bias z and equivalent N per block)."""
    frames = [
        variance_table(paired, slice(offset, offset + k)).assign(block=name)
        for name, offset, k in blocks
    ]
    table = pd.concat(frames, ignore_index=True)
    return table[["block", *(c for c in table.columns if c != "block")]]


def subsketch_coordinates(
    blocks: Sequence[tuple[str, int, int]], subsketches: int
) -> list[np.ndarray]:
    """S disjoint coordinate sets, every block's coordinates dealt out in turn (`j mod S`)."""
    return [
        np.concatenate([np.arange(offset + s, offset + k, subsketches) for _, offset, k in blocks])
        for s in range(subsketches)
    ]


def projection_error(
    paired: PairedDraws,
    blocks: Sequence[tuple[str, int, int]],
    subsketches: int = DEFAULT_SUBSKETCHES,
) -> dict[str, float]:
    """Measured relative error of the projected variances and of the ratios to `mean`, the
    median over the first aggregation's baselines and N (module docstring), beside the
    worst-case `√(2/k)` for k the smallest block's directions. Empty when a block has fewer
    than 2 directions per sub-sketch."""
    k_min = min(k for _, _, k in blocks)
    subsketches = min(subsketches, k_min // 2)
    if subsketches < 2:
        return {}
    total = sum(k for _, _, k in blocks)
    subsets = subsketch_coordinates(blocks, subsketches)
    agg = paired.aggregations[0]
    variance_err, ratio_err = [], []
    for estimates, _, _ in paired.per_size.values():
        # V_s = (K / |c_s|) · tr Cov over the sub-sketch's coordinates c_s, per baseline
        sub = {
            spec.label: np.array(
                [
                    trace_variance(estimates[agg, spec.label][0][:, c]) * total / len(c)
                    for c in subsets
                ]
            )
            for spec in paired.specs
        }
        reference = sub[REFERENCE]
        for spec in paired.specs:
            v = sub[spec.label]
            if v.mean() > 0:
                variance_err.append(v.std(ddof=1) / v.mean() / math.sqrt(subsketches))
            if spec.label != REFERENCE and (reference > 0).all():
                r = v / reference
                ratio_err.append(r.std(ddof=1) / r.mean() / math.sqrt(subsketches))
    return {
        "k": total,
        "subsketches": subsketches,
        "theory_worst_case": math.sqrt(2 / k_min),
        # NaN where no variance is positive (every reward of every group equal)
        "variance_relative_error": float(np.median(variance_err)) if variance_err else math.nan,
        "ratio_relative_error": float(np.median(ratio_err)) if ratio_err else math.nan,
    }
