"""The intervals of the columns derived from the variances (maths/variance/intervals.py:
`derived_intervals`, `unprojected`), on a mean curve planted as a power law, where N′ is known
in closed form."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from otb_diag.maths.variance.intervals import (
    compare_to_mean,
    derived_intervals,
    projection_factor_range,
    unprojected,
)

SIZES = [2, 4, 8, 16]


def table(otb: tuple[float, float, float]) -> pd.DataFrame:
    """The mean curve 1/N exactly (an interval of one point), OTB at N = 4 with (variance, low,
    high): N′ at an end is 1 / that end's variance (log-log interpolation is exact here)."""
    rows = [("mean", n, (1 / n,) * 3) for n in SIZES] + [("otb", 4, otb)]
    frame = pd.DataFrame(
        [{"aggregation": "token-sum", "baseline": b, "group_size": n, "variance": v,
          "ci_low": lo, "ci_high": hi} for b, n, (v, lo, hi) in rows]
    )  # fmt: skip
    return compare_to_mean(frame, SIZES)


def test_n_prime_interval_within_the_measured_n() -> None:
    rows = table((1 / 8, 1 / 10, 1 / 6))
    out = derived_intervals(rows).loc[rows["baseline"] == "otb"].iloc[0]
    assert out["equivalent_mean_group_size_low"] == pytest.approx(6.0)  # OTB's high end
    assert out["equivalent_mean_group_size_high"] == pytest.approx(10.0)  # its low end
    assert (out["equivalent_low_range"], out["equivalent_high_range"]) == ("within", "within")
    assert out["token_savings_low"] == pytest.approx(1 - 4 / 6)
    assert out["token_savings_high"] == pytest.approx(1 - 4 / 10)
    assert out["ratio_to_mean_low"] == pytest.approx((1 / 10) / (1 / 4))
    assert out["ratio_to_mean_high"] == pytest.approx((1 / 6) / (1 / 4))


def test_n_prime_ends_outside_the_measured_n_say_where() -> None:
    """OTB's interval reaching below the mean curve's lowest variance gives an end beyond the
    largest N (inf), above its highest one below the smallest N (a bound, at min N)."""
    rows = table((1 / 8, 1 / 100, 1.0))
    out = derived_intervals(rows).loc[rows["baseline"] == "otb"].iloc[0]
    assert out["equivalent_mean_group_size_low"] == 2.0
    assert out["equivalent_low_range"] == "below"
    assert math.isinf(out["equivalent_mean_group_size_high"])
    assert out["equivalent_high_range"] == "beyond"
    assert out["token_savings_low"] == pytest.approx(1 - 4 / 2)  # at most: a bound
    assert out["token_savings_high"] == pytest.approx(1 - 4 / 16)  # at least
    mean = derived_intervals(rows).loc[(rows["baseline"] == "mean") & (rows["group_size"] == 4)]
    assert float(mean["ratio_to_mean_low"].iloc[0]) == float(mean["ratio_to_mean_high"].iloc[0])


@pytest.mark.parametrize("k", [16, 256])
def test_the_projections_factor_range_is_the_chi_square_quantiles(k: int) -> None:
    low, high = projection_factor_range((k,))
    assert low == pytest.approx(stats.chi2.ppf(0.025, k) / k, rel=0.02)
    assert high == pytest.approx(stats.chi2.ppf(0.975, k) / k, rel=0.02)


def test_a_kronecker_sketch_spreads_wider_than_one_projection_of_its_k() -> None:
    """head's 16 × 16 sketch: a product of two χ²₁₆/16 factors, wider than one χ²₂₅₆/256."""
    (kron_low, kron_high), (low, high) = (
        projection_factor_range((16, 16)),
        projection_factor_range((256,)),
    )
    assert kron_low < low and kron_high > high


def test_unprojected_widens_by_the_factor_range() -> None:
    rows = table((1 / 8, 1 / 10, 1 / 6))
    low, high = projection_factor_range((32,))
    widened = unprojected(rows, (32,))
    np.testing.assert_allclose(widened["ci_low"], rows["ci_low"] / high)
    np.testing.assert_allclose(widened["ci_high"], rows["ci_high"] / low)
