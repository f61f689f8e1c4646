"""Aggregation modes: hand-computed values and agreement with verl's `agg_loss` formulas."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from otb_diag.errors import InputError
from otb_diag.maths.aggregation import AGGREGATIONS, aggregate, aggregation_weights

F64 = torch.float64

# Sequence 0 has 2 tokens, sequence 1 has 1, sequence 2 none; T = 4.
MASK = torch.tensor([[1, 1, 0, 0], [1, 0, 0, 0], [0, 0, 0, 0]], dtype=F64)
VALUES = torch.tensor([[1, 2, 100, 100], [3, 50, 50, 50], [7, 7, 7, 7]], dtype=F64)


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("token-sum", (1 + 2 + 3) / 2),  # sum per sequence, mean over the 2 non-empty ones
        ("seq-mean-token-sum", (1 + 2 + 3) / 2),
        ("seq-mean-token-mean", ((1 + 2) / 2 + 3 / 1) / 2),
        ("token-mean", (1 + 2 + 3) / 3),  # 3 generated tokens
        ("seq-mean-token-sum-norm", (1 + 2 + 3) / 4),  # divided by T = 4
    ],
)
def test_hand_values(name, expected):
    assert aggregate(name, VALUES, MASK).item() == pytest.approx(expected, rel=1e-7)


def test_coefficients_by_hand():
    torch.testing.assert_close(
        aggregation_weights("seq-mean-token-mean", MASK),
        torch.tensor([[1 / 4, 1 / 4, 0, 0], [1 / 2, 0, 0, 0], [0, 0, 0, 0]], dtype=F64),
    )
    torch.testing.assert_close(aggregation_weights("token-mean", MASK), MASK / 3)


def test_nan_outside_the_mask_never_counts():
    values = VALUES.clone()
    values[MASK == 0] = math.nan
    for name in AGGREGATIONS:
        assert torch.isfinite(aggregate(name, values, MASK)), name


def test_unknown_mode_lists_the_known_ones():
    with pytest.raises(InputError, match="known aggregations: .*token-mean"):
        aggregate("sum-everything", VALUES, MASK)


def verl_agg_loss(loss_mat, loss_mask, mode):
    """verl's `agg_loss` formulas (dp_size = 1), written out plainly."""
    seq_sums = [float((loss_mat[i] * loss_mask[i]).sum()) for i in range(len(loss_mat))]
    lengths = [float(loss_mask[i].sum()) for i in range(len(loss_mat))]
    nonempty = sum(1 for n in lengths if n > 0)
    if mode == "token-mean":
        return sum(seq_sums) / sum(lengths)
    if mode == "seq-mean-token-sum":
        return sum(s for s, n in zip(seq_sums, lengths, strict=True) if n > 0) / nonempty
    if mode == "seq-mean-token-mean":
        per_seq = [s / (n + 1e-8) for s, n in zip(seq_sums, lengths, strict=True) if n > 0]
        return sum(per_seq) / nonempty
    if mode == "seq-mean-token-sum-norm":
        return sum(seq_sums) / loss_mask.shape[-1]
    raise ValueError(mode)


@settings(max_examples=50, deadline=None)
@given(
    st.integers(0, 2**31 - 1),
    st.integers(1, 6),
    st.integers(1, 6),
    st.sampled_from(
        ["token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"]
    ),
)
def test_matches_verl_agg_loss(seed, rows, length, mode):
    gen = torch.Generator().manual_seed(seed)
    mask = (torch.rand(rows, length, generator=gen, dtype=F64) < 0.6).double()
    mask[0, 0] = 1.0  # verl's token-mean divides by the token count: keep it positive
    values = torch.randn(rows, length, generator=gen, dtype=F64)
    expected = verl_agg_loss(values, mask, mode)
    assert aggregate(mode, values, mask).item() == pytest.approx(expected, rel=1e-9, abs=1e-12)
    # c is 0 wherever mask is 0, so the estimator only sees generated tokens.
    assert torch.all(aggregation_weights(mode, mask)[mask == 0] == 0)
