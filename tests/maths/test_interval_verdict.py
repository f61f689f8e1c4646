"""A claim read off an interval in three words (maths/interval_verdict.py): planted intervals on
each side of the line and across it, and the rules' symmetry for any interval."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from otb_diag.maths.interval_verdict import (
    FAILS,
    HOLDS,
    NOT_RESOLVED,
    at_least,
    below,
    below_interval,
)


@pytest.mark.parametrize(
    ("low", "high", "verdict"),
    [
        (34.0, 50.0, HOLDS),  # wholly at or above 32
        (32.0, math.inf, HOLDS),  # an end on the line counts on the claim's side
        (5.9, 11.7, FAILS),  # wholly below
        (2.0, math.inf, NOT_RESOLVED),  # reaches past it
        (20.0, 32.0, NOT_RESOLVED),  # reaches it
        (math.nan, 50.0, NOT_RESOLVED),  # an undefined end decides nothing
    ],
)
def test_at_least(low: float, high: float, verdict: str) -> None:
    assert at_least(low, high, 32.0) == verdict


def test_below_is_at_least_mirrored() -> None:
    assert below(0.3, 0.7, 1.0) == HOLDS
    assert below(1.0, 1.5, 1.0) == FAILS
    assert below(0.04, 2.9, 1.0) == NOT_RESOLVED


finite = st.floats(-1e6, 1e6, allow_nan=False)


@given(finite, finite, finite)
def test_the_verdict_follows_where_the_interval_lies(a: float, b: float, t: float) -> None:
    low, high = min(a, b), max(a, b)
    verdict = at_least(low, high, t)
    assert (verdict == HOLDS) == (low >= t)
    assert (verdict == FAILS) == (high < t)
    assert {at_least(low, high, t), below(low, high, t)} in (
        {HOLDS, FAILS}, {NOT_RESOLVED}
    )  # fmt: skip


@pytest.mark.parametrize(
    ("x", "y", "verdict"),
    [
        ((25.0, 100.0), (150.0, 600.0), HOLDS),
        ((75.0, 300.0), (150.0, 600.0), NOT_RESOLVED),
        ((75.0, 300.0), (150.0, math.inf), NOT_RESOLVED),  # the other open above
        ((700.0, 900.0), (150.0, 600.0), FAILS),
    ],
)
def test_below_interval(x: tuple[float, float], y: tuple[float, float], verdict: str) -> None:
    assert below_interval(x, y) == verdict
