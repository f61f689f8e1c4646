"""Statistics over the paired draws of `paired_draws.py`: the trace variance, its bootstrap
interval, the bias z-score and the equivalent group size (definitions in `paired_draws.py`), and
the intervals of the columns derived from the variances (`derived_intervals`)."""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from itertools import product

import numpy as np
import pandas as pd

REFERENCE = "mean"  # the curve equivalent group sizes are read off
# The columns `compare_to_mean` derives from the variances, whose intervals `derived_intervals`
# propagates.
DERIVED = ("ratio_to_mean", "equivalent_mean_group_size", "token_savings")


def trace_variance(g: np.ndarray) -> float:
    """`sum_r ||g_r - mean g||^2 / (R - 1)` for `g: [R, k]` (trace of the unbiased covariance)."""
    centred = g - g.mean(0)
    return float(np.square(centred).sum() / (len(g) - 1))


def bootstrap_counts(draws: int, resamples: int, rng: np.random.Generator) -> np.ndarray:
    """`[S, R]` multiplicities of each draw in S bootstrap resamples (R draws with replacement)."""
    return rng.multinomial(draws, np.full(draws, 1.0 / draws), size=resamples)


def bootstrap_interval(
    g: np.ndarray, counts: np.ndarray, level: float = 0.95
) -> tuple[float, float]:
    """Percentile interval of `trace_variance` over the resamples `counts: [S, R]` of `g: [R, k]`.

    A resample's variance is `(sum_r n_r ||x_r||^2 - R ||m||^2) / (R - 1)`, `m = sum_r n_r x_r / R`,
    on draws centred first (the variance is shift-invariant; centring avoids cancellation).
    """
    _, variances = resampled_moments(g, counts)
    return percentile_interval(variances, level)


def resampled_moments(g: np.ndarray, counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """`(means [S, k], variances [S])` of the resamples `counts: [S, R]` of `g: [R, k]`: each
    resample's mean `m = sum_r n_r g_r / R` and its `trace_variance`."""
    r = len(g)
    shift = g.mean(0)
    centred = g - shift
    means = counts @ centred / r  # [S, k], about the shift
    variances = (counts @ np.square(centred).sum(1) - r * np.square(means).sum(1)) / (r - 1)
    return means + shift, variances


def percentile_interval(values: np.ndarray, level: float = 0.95) -> tuple[float, float]:
    """The central `level` percentile interval of bootstrap `values: [S]`."""
    low, high = np.percentile(values, [50 * (1 - level), 50 * (1 + level)])
    return float(low), float(high)


def bias_z(d: np.ndarray) -> float:
    """Root-mean-square over coordinates of `z_j = mean_r d_rj / (std_r d_rj / sqrt(R))` for the
    paired differences `d: [R, k]`; a coordinate that never varies counts 0 if its mean is 0 and
    inf otherwise."""
    mean = d.mean(0)
    se = d.std(0, ddof=1) / math.sqrt(len(d))
    z = np.divide(mean, se, out=np.where(mean == 0, 0.0, np.inf), where=se > 0)
    return float(np.sqrt(np.mean(np.square(z))))


def equivalent_group_size(
    sizes: Sequence[int], reference: Sequence[float], target: float
) -> tuple[float, str]:
    """The N' at which the reference variance curve `reference[j]` at `sizes[j]` (increasing N)
    first comes down to `target`, by linear interpolation of log variance against log N.

    Returns (N', range) with range "within", "beyond" (N' = inf) or "below" (N' = min N, an
    upper bound), as the module docstring defines.
    """
    for j, v in enumerate(reference):
        if v > target:
            continue
        if v == target:
            return float(sizes[j]), "within"
        if j == 0:
            return float(sizes[0]), "below"
        # log N' = log N_{j-1} + (log V* - log V_{j-1}) / (log V_j - log V_{j-1}) * (log N_j - ...)
        with np.errstate(divide="ignore"):
            lv = np.log([reference[j - 1], v, target])
        frac = (lv[2] - lv[0]) / (lv[1] - lv[0])
        ln = np.log([sizes[j - 1], sizes[j]])
        return float(np.exp(ln[0] + frac * (ln[1] - ln[0]))), "within"
    return math.inf, "beyond"


def compare_to_mean(table: pd.DataFrame, sizes: Sequence[int]) -> pd.DataFrame:
    """Add ratio_to_mean, equivalent_mean_group_size, equivalent_range and token_savings to
    `table` (one row per aggregation, baseline and N; columns aggregation, baseline, group_size,
    variance), against the rows labelled `mean` at the measured `sizes`."""
    columns: dict[str, list] = {k: [] for k in ("ratio", "equivalent", "range", "savings")}
    for row in table.itertuples():
        curve = table[(table.aggregation == row.aggregation) & (table.baseline == REFERENCE)]
        curve = curve.set_index("group_size").loc[list(sizes), "variance"]
        reference = curve.loc[row.group_size]
        ratio = (
            row.variance / reference if reference > 0 else (1.0 if row.variance == 0 else np.inf)
        )
        n_prime, where = equivalent_group_size(sizes, curve.to_list(), row.variance)
        bound = {"within": n_prime, "beyond": max(sizes), "below": min(sizes)}[where]
        columns["ratio"].append(ratio)
        columns["equivalent"].append(n_prime)
        columns["range"].append(where)
        columns["savings"].append(1.0 - row.group_size / bound)  # 1 - N / N'
    return table.assign(
        ratio_to_mean=columns["ratio"],
        equivalent_mean_group_size=columns["equivalent"],
        equivalent_range=columns["range"],
        token_savings=columns["savings"],
    )


@functools.cache
def projection_factor_range(dims: tuple[int, ...]) -> tuple[float, float]:
    """95 % range of the factor by which a seeded random projection scales a squared norm, in
    the worst case (a rank-one covariance): the product over `dims` of independent `χ²_d / d`
    (one Gaussian projection to k dimensions: `dims = (k,)`; a Kronecker sketch `k₁ × k₂`: two
    factors). Quantiles from a fixed-seed Monte Carlo of 200,000 draws (error ~0.3 %, far below
    what they widen)."""
    rng = np.random.default_rng(0)
    factor = np.ones(200_000)
    for dim in dims:
        factor *= rng.chisquare(dim, factor.size) / dim
    low, high = np.quantile(factor, [0.025, 0.975])
    return float(low), float(high)


def unprojected(rows: pd.DataFrame, dims: tuple[int, ...]) -> pd.DataFrame:
    """`rows` (variance.csv's rows of one mode) with `ci_low`/`ci_high` widened into an
    interval for the unprojected variance: the bootstrap (over draws, projection fixed) does
    not see the seeded projection of the scores, whose factor `q` (`projection_factor_range`,
    `[q_lo, q_hi]`) scales the trace, so `[ci_low / q_hi, ci_high / q_lo]`."""
    q_lo, q_hi = projection_factor_range(dims)
    return rows.assign(ci_low=rows["ci_low"] / q_hi, ci_high=rows["ci_high"] / q_lo)


def derived_intervals(rows: pd.DataFrame) -> pd.DataFrame:
    """The intervals of the `DERIVED` columns of `rows` (one mode's rows of `compare_to_mean`'s
    table, with the variance intervals `ci_low`/`ci_high`): per row, the range of
    `compare_to_mean` over the four corners (this row's variance at its interval's low or high
    end) x (the `mean` curve at its intervals' low or high ends), and the point value itself.
    The corners ignore the pairing of the draws, so the bands are wide on purpose.

    Returns a frame indexed as `rows`: `<column>_low` and `<column>_high` for each derived
    column, and where N′'s ends lie, `equivalent_low_range` and `equivalent_high_range`
    ("within", "beyond": N′ = inf, above the largest N measured, "below": N′ at most the
    smallest N measured; as `equivalent_group_size` says of the point)."""
    sizes = sorted(rows["group_size"].unique().tolist())
    is_reference = rows["baseline"] == REFERENCE
    keys = rows[["aggregation", "baseline", "group_size"]]
    corners = [rows]
    for own, ref in product(("ci_low", "ci_high"), repeat=2):
        variance = np.where(is_reference, rows[ref], rows[own])
        corners.append(compare_to_mean(keys.assign(variance=variance), sizes))
    out = pd.DataFrame(index=rows.index)
    for column in DERIVED:
        values = np.stack([c[column].to_numpy(np.float64) for c in corners])  # [5, rows]
        out[f"{column}_low"], out[f"{column}_high"] = values.min(0), values.max(0)
    # N′ is "below" at min N and inf "beyond": the ends' ranges follow from the values, a
    # "below" corner taking precedence at the smallest N (a bound, not a value).
    n_prime = np.stack([c["equivalent_mean_group_size"].to_numpy(np.float64) for c in corners])
    below = np.stack([(c["equivalent_range"] == "below").to_numpy() for c in corners])
    for end in ("low", "high"):
        value = out[f"equivalent_mean_group_size_{end}"].to_numpy()
        bound = (below & (n_prime == value)).any(0)
        out[f"equivalent_{end}_range"] = np.where(
            np.isinf(value), "beyond", np.where(bound, "below", "within")
        )
    return out
