"""Variance proxies: hand-computed batches and agreement with verl's formulas on random ones."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from otb_diag.maths.energy.proxies import proxies_by_baseline, variance_proxies

F64 = torch.float64


def t(rows):
    return torch.tensor(rows, dtype=F64)


# Sequence 0: 2 tokens, A = [1, 3]   -> Abar = 2,  w = [0.5, 1.5] -> W = 2
# Sequence 1: 3 tokens, A = -1       -> Abar = -1, w = [1, 1, 1]  -> W = 3
# Sequence 2: nothing generated (an aborted generation): Abar = 0, W = 0, counted in every
# mean and in N_batch as verl 0.9.1 counts it (N = 3).
MASK = t([[1, 1, 0], [1, 1, 1], [0, 0, 0]])
ADV = t([[1, 3, 9], [-1, -1, -1], [5, 5, 5]])
W = t([[0.5, 1.5, 7], [1, 1, 1], [4, 4, 4]])


def test_on_policy_hand_batch():
    metrics = variance_proxies(ADV, MASK, W, grad_norm=1.5)
    expected = {
        "proxy2_total_power": (2**2 * 2 + 1 * 3 + 0) / 3,  # 11/3
        "expected_a_squared": (4 + 1 + 0) / 3,
        "expected_w": (2 + 3 + 0) / 3,
        "logit_total_power": 11 / 3,  # τ = 1: verl's w and ours agree
        "token_total_power": ((0.5 * 1 + 1.5 * 9) + 3 * 1 + 0) / 3,  # (14 + 3)/3
        "proxy1_signal_strength": 1.5**2,
        "proxy3_pure_noise": (11 / 3 - 2.25) / (3 - 1),
    }
    assert metrics == pytest.approx(expected, rel=1e-7)


def test_negative_energy_is_clamped_in_proxy2_only():
    w = W.clone()
    w[1] = -1.0  # W_1 = -3
    metrics = variance_proxies(ADV, MASK, w)
    assert metrics["proxy2_total_power"] == pytest.approx((4 * 2 + 1 * 0) / 3)
    assert metrics["expected_w"] == pytest.approx((2 - 3) / 3)


def test_temperature_verls_names_take_verls_w_ours_the_raw_logits():
    """verl's `w` is `1 − 2p + Σπ²` of the tempered logits; ours (the input) is that over τ²:
    verl's names carry τ² times ours, our names ours."""
    tau = torch.tensor([0.7, 0.5, 2.0], dtype=F64)
    metrics = variance_proxies(ADV, MASK, W, temperature=tau)
    assert metrics["proxy2_total_power"] == pytest.approx((4 * 2 * 0.49 + 1 * 3 * 0.25) / 3)
    assert metrics["expected_w"] == pytest.approx((2 * 0.49 + 3 * 0.25) / 3)
    assert metrics["logit_total_power"] == pytest.approx(11 / 3)
    assert metrics["token_total_power"] == pytest.approx(17 / 3)
    assert metrics["expected_a_squared"] == pytest.approx(5 / 3)


def test_without_a_gradient_norm_proxy1_and_proxy3_are_left_out():
    metrics = variance_proxies(ADV, MASK, W, prefix="variance_proxy/")
    assert set(metrics) == {
        "variance_proxy/proxy2_total_power",
        "variance_proxy/expected_a_squared",
        "variance_proxy/expected_w",
        "variance_proxy/logit_total_power",
        "variance_proxy/token_total_power",
    }


def test_pure_noise_is_floored_at_zero():
    metrics = variance_proxies(ADV, MASK, W, grad_norm=10.0)
    assert metrics["proxy3_pure_noise"] == 0.0


def test_importance_weights_hand_batch():
    # rhobar_0 = (1 + 3)/2 = 2, rhobar_1 = 0.5 (mean of rho, then squared)
    rho = t([[1, 3, 5], [0.5, 0.5, 0.5], [2, 2, 2]])
    metrics = variance_proxies(ADV, MASK, W, is_weights=rho)
    expected = {
        "proxy2_total_power": (2**2 * 2**2 * 2 + 0.5**2 * 1 * 3) / 3,  # (32 + 0.75)/3
        "expected_a_squared": 5 / 3,
        # verl's expected_w with IS is sum_t w rho^2: 0.5*1 + 1.5*9 = 14 and 3 * 0.25
        "expected_w": (14 + 0.75) / 3,
        "logit_total_power": (32 + 0.75) / 3,
        "token_total_power": ((0.5 * 1 * 1 + 1.5 * 9 * 9) + 3 * 0.25 * 1) / 3,  # (122 + 0.75)/3
    }
    assert metrics == pytest.approx(expected, rel=1e-7)


def test_nothing_generated_gives_zeros():
    metrics = variance_proxies(ADV, torch.zeros_like(MASK), W, grad_norm=2.0)
    assert metrics == {
        "proxy2_total_power": 0.0,
        "expected_a_squared": 0.0,
        "expected_w": 0.0,
        "logit_total_power": 0.0,
        "token_total_power": 0.0,
        "proxy1_signal_strength": 4.0,
        "proxy3_pure_noise": 0.0,  # max(0, (0 − 4)/(3 − 1)): verl floors it at 0
    }


def verl_proxies(advantages, mask, w, rho, grad_norm):
    """verl's `compute_variance_proxy_metrics` formulas (0.9.1), one sequence at a time, every
    row counted (an empty one with Abar = 0 and W = 0)."""
    a_bar, w_sum, w_orig, rho_bar = [], [], [], []
    for i in range(len(mask)):
        n = float(mask[i].sum())
        tokens = [s for s in range(mask.shape[1]) if mask[i, s] > 0]
        a_bar.append(sum(float(advantages[i, s]) for s in tokens) / (n + 1e-8))
        scale = [1.0 if rho is None else float(rho[i, s]) ** 2 for s in tokens]
        w_sum.append(sum(float(w[i, s]) * c for s, c in zip(tokens, scale, strict=True)))
        w_orig.append(
            sum(float(w[i, s]) * c / max(c, 1e-10) for s, c in zip(tokens, scale, strict=True))
        )
        rho_bar.append(1.0 if rho is None else sum(float(rho[i, s]) for s in tokens) / (n + 1e-8))
    count = len(a_bar)
    proxy2 = (
        sum(r**2 * a**2 * max(x, 0.0) for r, a, x in zip(rho_bar, a_bar, w_orig, strict=True))
        / count
    )
    metrics = {
        "proxy2_total_power": proxy2,
        "expected_a_squared": sum(a**2 for a in a_bar) / count,
        "expected_w": sum(w_sum) / count,
        "proxy1_signal_strength": grad_norm**2,
    }
    if count > 1:
        metrics["proxy3_pure_noise"] = max(0.0, (proxy2 - grad_norm**2) / (count - 1))
    return metrics


@settings(max_examples=50, deadline=None)
@given(st.integers(0, 2**31 - 1), st.integers(1, 6), st.integers(1, 6), st.booleans())
def test_matches_verls_formulas_on_random_batches(seed, rows, length, use_rho):
    gen = torch.Generator().manual_seed(seed)
    mask = (torch.rand(rows, length, generator=gen, dtype=F64) < 0.6).double()
    mask[0, 0] = 1.0
    advantages = torch.randn(rows, length, generator=gen, dtype=F64)
    w = torch.rand(rows, length, generator=gen, dtype=F64) * 2 - 0.2  # some slightly negative
    rho = torch.rand(rows, length, generator=gen, dtype=F64) * 2 if use_rho else None
    metrics = variance_proxies(advantages, mask, w, is_weights=rho, grad_norm=0.3)
    expected = verl_proxies(advantages, mask, w, rho, 0.3)
    assert {k: metrics[k] for k in expected} == pytest.approx(expected, rel=1e-9, abs=1e-12)


def by_hand(a, mask, w, rho, tau) -> dict[str, float]:
    """The five sequence proxies of one baseline, row by row in float64 (the module docstring's
    formulas, written out again)."""
    a, mask, w, tau = (np.asarray(x, np.float64) for x in (a, mask, w, tau))
    on_policy = rho is None
    rho = np.ones_like(w) if on_policy else np.asarray(rho, np.float64)
    rows = []
    for i in range(len(a)):
        keep = mask[i] > 0
        a_bar = a[i][keep].sum() / (keep.sum() + 1e-8)
        rho_bar = 1.0 if on_policy else rho[i][keep].sum() / (keep.sum() + 1e-8)
        energy = (w[i] * rho[i] ** 2 / np.maximum(rho[i] ** 2, 1e-10))[keep].sum()  # W_i
        rows.append(
            {
                "proxy2_total_power": rho_bar**2 * max(tau[i] ** 2 * energy, 0) * a_bar**2,
                "expected_a_squared": a_bar**2,
                "expected_w": tau[i] ** 2 * (w[i] * rho[i] ** 2)[keep].sum(),
                "logit_total_power": rho_bar**2 * max(energy, 0) * a_bar**2,
                "token_total_power": (w[i] * rho[i] ** 2 * a[i] ** 2)[keep].sum(),
            }
        )
    return {k: float(np.mean([r[k] for r in rows])) for k in rows[0]}


@settings(max_examples=30, deadline=None)
@given(st.integers(0, 2**31 - 1), st.integers(1, 5), st.integers(1, 6), st.booleans())
def test_every_baseline_at_once_equals_each_on_its_own(seed, baselines, length, use_rho):
    """`proxies_by_baseline` stacks the baselines' advantages into one `[n, B, T]` pass: each
    baseline's proxies are still its own, as written out row by row (`by_hand`)."""
    gen = torch.Generator().manual_seed(seed)
    rows = 4
    mask = (torch.rand(rows, length, generator=gen) < 0.7).float()
    w = torch.rand(rows, length, generator=gen)
    rho = torch.rand(rows, length, generator=gen) * 2 if use_rho else None
    tau = torch.rand(rows, generator=gen) + 0.5
    advantages = {f"b{i}": torch.randn(rows, length, generator=gen) for i in range(baselines)}
    together = proxies_by_baseline(advantages, mask, w, rho, tau)
    scale = float((w.abs() * (1 if rho is None else rho**2)).sum(-1).max())  # the largest Σ w ρ²
    for name, a in advantages.items():
        expected = by_hand(a, mask, w, rho, tau)
        assert together[name] == pytest.approx(expected, rel=1e-5, abs=1e-6 * scale), name
