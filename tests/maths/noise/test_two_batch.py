"""McCandlish's two-batch estimator (`maths/noise/two_batch.py`): it solves its two equations
exactly (hand case), is unbiased on a planted truth (processes' gradients drawn around a known
G with a known covariance), and refuses batch sizes that do not give two equations."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from otb_diag.errors import InputError
from otb_diag.maths.noise.two_batch import two_batch_noise


def test_a_hand_case() -> None:
    # |G|² = 2, tr Σ = 12: E|g_small|² = 2 + 12/3 = 6 at 3 prompts, E|g_big|² = 2 + 12/6 = 4 at 6
    out = two_batch_noise(6.0, 4.0, 3, 6)
    assert out.grad_sq == pytest.approx(2.0, rel=1e-12)
    assert out.total == pytest.approx(12.0, rel=1e-12)


@given(
    grad_sq=st.floats(-10, 10),
    total=st.floats(0, 100),
    b_small=st.integers(1, 64),
    processes=st.integers(2, 16),
)
def test_the_expected_squares_give_the_truth_back(grad_sq, total, b_small, processes) -> None:
    """Fed the expectations `|G|² + tr Σ / B`, the estimator returns `|G|²` and `tr Σ`."""
    b_big = processes * b_small
    out = two_batch_noise(grad_sq + total / b_small, grad_sq + total / b_big, b_small, b_big)
    scale = abs(grad_sq) + total + 1
    assert out.grad_sq == pytest.approx(grad_sq, abs=1e-9 * scale)
    assert out.total == pytest.approx(total, abs=1e-9 * scale * b_small)


def test_unbiased_on_a_planted_truth() -> None:
    """W = 4 processes of B_small = 3 prompts; each prompt's estimate ĝ_p ~ N(G, Σ) in d = 20,
    Σ diagonal and uneven. Over 20,000 simulated steps the means of the estimates are within
    4 standard errors of |G|² and tr Σ, and the standard errors are small beside the truth."""
    generator = torch.Generator().manual_seed(0)
    d, processes, b_small, steps = 20, 4, 3, 20_000
    g_true = torch.linspace(-0.3, 0.5, d, dtype=torch.float64)
    sd = torch.linspace(0.2, 1.5, d, dtype=torch.float64)
    prompts = g_true + sd * torch.randn(
        steps, processes, b_small, d, generator=generator, dtype=torch.float64
    )
    local = prompts.mean(2)  # [steps, W, d] each process's gradient over its B_small prompts
    big = local.mean(1)  # [steps, d] the all-reduced mean over B_big = W B_small prompts
    small_sq = local.square().sum(-1).mean(1)  # |g_small|² averaged over the processes
    big_sq = big.square().sum(-1)
    est = two_batch_noise(small_sq, big_sq, b_small, processes * b_small)  # tensors broadcast
    for value, truth in ((est.grad_sq, g_true.square().sum()), (est.total, sd.square().sum())):
        mean, se = value.mean(), value.std() / steps**0.5
        assert abs(float(mean - truth)) < 4 * float(se), (float(mean), float(truth))
        assert float(se) < 0.05 * float(truth)


@pytest.mark.parametrize(("b_small", "b_big"), [(4, 4), (0, 8), (8, 4)])
def test_batch_sizes_that_give_no_second_equation_are_refused(b_small, b_big) -> None:
    with pytest.raises(InputError, match="0 < B_small < B_big"):
        two_batch_noise(1.0, 1.0, b_small, b_big)
