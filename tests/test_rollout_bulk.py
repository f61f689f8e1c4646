"""The whole-list value checks of `rollout_rows` (a fast path) accept exactly what the per-entry
checks accept and return the same list; on anything else they defer (None) to the loop, which
names the entry."""

from __future__ import annotations

import math
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from otb_diag.io.rollout_rows import _BULK

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
    ids=str,
)
def test_bulk_check_takes_the_common_case(check: Any, values: list[Any]) -> None:
    """Clean lists do not fall back to the loop (that is the point of the fast path)."""
    if check.__name__ == "_token_id" and any(isinstance(v, float) for v in values):
        assert _BULK[check](values) is None  # float ids are rejected by the loop: deferred
    else:
        assert _BULK[check](values) == per_entry(check, values)
