"""The 95 % intervals that every reading of variance.csv uses: `variance-compare`'s verdicts
(`conclusions.py`), the report's sentences and `regress`'s overlap test
(`pipelines/regress/run_metrics.py`), so the three never disagree about one number.

A row's variance interval is the bootstrap interval over draws widened for the seeded random
projection of the scores (`maths/variance/intervals.py:unprojected`); the ratio to the mean
baseline, N′ and the token saving get theirs by propagation through the mean curve
(`maths/variance/intervals.py:derived_intervals`)."""

from __future__ import annotations

import pandas as pd

from otb_diag.maths.variance.intervals import derived_intervals, unprojected


def projection_dims(mode: str, k: int) -> tuple[int, ...]:
    """The projections a mode's k-dimensional scores went through: one Gaussian projection to k
    (`proxy`, `full`), or `head`'s Kronecker sketch, two of `k₁ · k₂ = k`
    (`otb_diag/policy/scores/token_scores.py:kronecker_split`)."""
    from otb_diag.policy.scores.token_scores import kronecker_split

    return kronecker_split(k) if mode == "head" else (k,)


def mode_intervals(rows: pd.DataFrame, mode: str, k: int) -> pd.DataFrame:
    """One mode's rows of variance.csv (one checkpoint) with the unprojected variance interval
    in `ci_low`/`ci_high` and, beside them, the derived columns' intervals
    (`derived_intervals`' columns)."""
    widened = unprojected(rows, projection_dims(mode, k))
    return widened.join(derived_intervals(widened))
