"""The chunk planner: a given free-memory figure in, the largest power of two that fits out."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from otb_diag.errors import InputError
from otb_diag.runtime.memory import rows_that_fit


def test_hand_cases() -> None:
    # 1 GiB free, a quarter of it for rows of 1 MiB: 256 rows fit exactly.
    assert rows_that_fit(2**30, 2**20, share=0.25, smallest=1, largest=4096) == 256
    # one byte short of 256 rows: the next power of two down
    assert rows_that_fit(2**30 - 4, 2**20, share=0.25, smallest=1, largest=4096) == 128
    assert rows_that_fit(2**40, 2**20, share=0.25, smallest=1, largest=4096) == 4096  # capped
    assert rows_that_fit(0, 2**20, share=0.25, smallest=64, largest=4096) == 64  # floor


@given(
    free=st.floats(0, 2**45),
    per_row=st.floats(1, 2**30),
    share=st.floats(0.01, 1),
    smallest=st.integers(1, 512),
    extra=st.integers(0, 8192),
)
def test_largest_power_of_two_that_fits(free, per_row, share, smallest, extra) -> None:
    largest = smallest + extra
    rows = rows_that_fit(free, per_row, share=share, smallest=smallest, largest=largest)
    assert smallest <= rows <= largest
    if rows > smallest:  # chosen by the memory, not the floor: it fits, and twice it does not
        assert rows & (rows - 1) == 0 and rows * per_row <= share * free
        assert 2 * rows > largest or 2 * rows * per_row > share * free


@pytest.mark.parametrize("args", [(1e9, 0, 1, 8), (1e9, 10, 0, 8), (1e9, 10, 9, 8)])
def test_bad_arguments(args) -> None:
    free, per_row, smallest, largest = args
    with pytest.raises(InputError):
        rows_that_fit(free, per_row, share=0.5, smallest=smallest, largest=largest)
