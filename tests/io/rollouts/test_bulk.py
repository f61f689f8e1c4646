"""The whole-list value checks of `rollout_rows` and the whole-row probability check of
`consistency` (fast paths) accept exactly what the per-entry checks accept and return the same
values; on anything else they defer (None) to the loop, which names the entry."""

from __future__ import annotations

import math
import struct
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from otb_diag.errors import InputError
from otb_diag.io.rollouts.probability_checks import TOLERANCE, _clean_entries, _clean_rows
from otb_diag.io.rollouts.rows import _BULK, Response

ENTRIES = st.one_of(
    st.integers(-3, 3),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([0.0, 1.0, True, False, "1", None]),
)


def per_entry(check: Any, values: list[Any]) -> list[Any] | None:
    try:
        return [check(v) for v in values]
    except ValueError:
        return None


@pytest.mark.parametrize("check", list(_BULK), ids=lambda c: c.__name__)
@given(values=st.lists(ENTRIES, max_size=12))
def test_bulk_check_agrees_with_the_per_entry_check(check: Any, values: list[Any]) -> None:
    bulk = _BULK[check](list(values))
    loop = per_entry(check, values)
    if bulk is None:
        return  # deferred: the loop decides (and names the entry when it fails)
    assert loop is not None, "the fast path accepted what the loop rejects"
    assert [type(v) for v in bulk] == [type(v) for v in loop]
    assert all(a == b or (math.isnan(a) and math.isnan(b)) for a, b in zip(bulk, loop, strict=True))


@pytest.mark.parametrize(
    ("check", "values"),
    [(c, v) for c in _BULK for v in ([0, 1, 1], [1.0, 0.0], [])],
    ids=lambda x: x.__name__ if callable(x) else str(x),  # the same ids in every xdist worker
)
def test_bulk_check_takes_the_common_case(check: Any, values: list[Any]) -> None:
    """Clean lists do not fall back to the loop (that is the point of the fast path)."""
    if check.__name__ == "_token_id" and any(isinstance(v, float) for v in values):
        assert _BULK[check](values) is None  # float ids are rejected by the loop: deferred
    else:
        assert _BULK[check](values) == per_entry(check, values)


# Logged probabilities near every rule's edge: round-off above 0 and 1, sum_pi2 at, just
# above and just below p² (inside and beyond the tolerance), zeros, negative weights.
LOGPROB = st.one_of(
    st.floats(-30.0, 0.0),
    st.sampled_from([0.0, -0.0, 2.0**-9, 2.0**-7, 2.0**-7 + 2.0**-20, -1e-300, -2.0]),
)
SUM_PI2 = st.one_of(
    st.floats(1e-6, 1.0),
    st.sampled_from([1.0 + 2.0**-8, 1.0 + 2.0**-7, 1.0 + 2.0**-6, 0.0, -1e-9, 1e-300]),
)


@st.composite
def probability_rows(draw: st.DrawFn) -> Response:
    n = draw(st.integers(0, 8))
    logprobs = draw(st.lists(LOGPROB, min_size=n, max_size=n))
    sum_pi2 = [
        draw(
            st.one_of(
                SUM_PI2,
                # p² itself, then moved by a relative amount around 0 and around the tolerance
                st.floats(-1.5 * TOLERANCE, 1e-6).map(
                    lambda d, lp=lp: math.exp(2 * min(lp, 0.0)) * (1 + d)
                ),
                st.integers(-3, 3).map(
                    lambda k, lp=lp: (
                        math.nextafter(math.exp(2 * min(lp, 0.0)), k * math.inf)
                        if k
                        else math.exp(2 * min(lp, 0.0))
                    )
                ),
            )
        )
        for lp in logprobs
    ]
    weights = draw(st.none() | st.lists(st.floats(-1.0, 3.0), min_size=n, max_size=n))
    return Response(
        group="g",
        sample=0,
        source_row=1,
        logprobs=draw(st.sampled_from([logprobs, None])),
        sum_pi2=draw(st.sampled_from([sum_pi2, sum_pi2[: n // 2], None])),
        is_weights=weights,
    )


def fail(field: str, message: str, hint: str | None) -> InputError:
    return InputError(message, field=field, hint=hint)


@given(row=probability_rows())
def test_row_check_of_probabilities_agrees_with_the_entry_loop(row: Response) -> None:
    """`consistency._clean_rows` (numpy) gives exactly the loop's clamped values and counts,
    or defers (None) exactly where the loop raises."""
    try:
        expected = _clean_entries(row, fail)
    except InputError:
        expected = None
    got = _clean_rows(row)
    if expected is None:
        assert got is None
        return
    assert got is not None, "the row check deferred on a row the loop accepts"
    for a, b in zip(got[:2], expected[:2], strict=True):
        assert (a is None) == (b is None)
        if a is not None:  # bit for bit, signed zeros included
            assert [struct.pack("<d", x) for x in a] == [struct.pack("<d", x) for x in b]
    assert got[2] == expected[2]
