"""Forward-only gradient-variance proxies (docs/theory.md §4), as verl logs them.

Reproduces `compute_variance_proxy_metrics` in `verl/trainer/ppo/metric_utils.py`, version with
`valid_seq_mask`: sequences with no generated token are left out of every mean and of `N_batch`.
verl prefixes the names with `variance_proxy/` (pass `prefix=` for that) and logs 0.0 for the
proxies it cannot compute; here those keys are left out instead.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import torch
from torch import Tensor

_VERL_MASKED_MEAN_EPS = 1e-8  # verl_F.masked_mean adds it to the token count
_VERL_RHO2_FLOOR = 1e-10  # verl divides w rho^2 by max(rho^2, 1e-10) to recover w


def _masked_mean(x: Tensor, keep: Tensor) -> Tensor:
    """Per-sequence masked mean, verl's way: `[B, T] -> [B]` (`keep`: the mask as booleans)."""
    return _masked_sum(x, keep) / (keep.sum(-1).to(x.dtype) + _VERL_MASKED_MEAN_EPS)


def _masked_sum(x: Tensor, keep: Tensor) -> Tensor:
    return torch.where(keep, x, 0.0).sum(-1)


def variance_proxies(
    advantages: Tensor,
    mask: Tensor,
    w: Tensor,
    *,
    is_weights: Tensor | None = None,
    grad_norm: float | None = None,
    prefix: str = "",
) -> dict[str, float]:
    """verl's variance proxies plus a token-level total power, as plain floats.

    Args:
        advantages: `[B, T]` token advantages `A_t`.
        mask: `[B, T]` 1 on generated tokens.
        w: `[B, T]` per-token logit-gradient proxy `1 - 2 p_t + sum_pi2_t` (not cumulative).
        is_weights: `[B, T]` truncated IS weights `rho_t`, or None on-policy.
        grad_norm: `||g||` of the batch gradient (a training log or an exact mode); without it
            `proxy1_signal_strength` and `proxy3_pure_noise` are left out.

    Returns, over the `N` sequences with a generated token, with `Abar_i` the masked mean of
    `A_t` and `W_i = sum_t mask_t w_t`:
        proxy2_total_power  = mean_i Abar_i^2 max(W_i, 0); with IS
                              mean_i rhobar_i^2 Abar_i^2 max(W_i, 0), rhobar_i the masked mean
                              of rho_t (so its square, not the mean of rho^2)
        proxy1_signal_strength = grad_norm^2
        proxy3_pure_noise   = max(0, (proxy2 - proxy1) / (N - 1)), only when N > 1
        expected_a_squared  = mean_i Abar_i^2
        expected_w          = mean_i W_i; with IS verl uses sum_t mask_t rho_t^2 w_t, unclamped
        token_total_power   = mean_i sum_t mask_t w_t A_t^2 (w rho^2 with IS; not in verl)
    """
    metrics = proxies_by_baseline({"": advantages}, mask, w, is_weights=is_weights)[""]
    if grad_norm is not None:
        proxy1 = grad_norm**2  # ||gbar||^2
        metrics["proxy1_signal_strength"] = proxy1
        n_batch = int((mask.sum(-1) > 0).sum())
        if n_batch > 1:
            noise = (metrics["proxy2_total_power"] - proxy1) / (n_batch - 1)
            metrics["proxy3_pure_noise"] = max(0.0, noise)
    return {prefix + name: value for name, value in metrics.items()}


_SEQUENCE_PROXIES = ("proxy2_total_power", "expected_a_squared", "expected_w", "token_total_power")


def proxies_by_baseline(
    advantages: Mapping[str, Tensor], mask: Tensor, w: Tensor, is_weights: Tensor | None = None
) -> dict[str, dict[str, float]]:
    """`variance_proxies` (without `grad_norm` and `prefix`) of each baseline's `[B, T]`
    advantages over one batch: the terms that do not depend on the advantages (`W_i`,
    `expected_w`, `rhobar_i^2`, `w rho^2`) are computed once."""
    valid = mask.sum(-1) > 0
    if not valid.any():
        # verl's early exit: nothing was generated, so every proxy is 0.
        return {b: dict.fromkeys(_SEQUENCE_PROXIES, 0.0) for b in advantages}
    every = bool(valid.all())  # the common case: no copy of the [B, T] tensors

    def rows(x: Tensor) -> Tensor:
        return x if every else x[valid]

    keep = rows(mask).bool()
    shared = _shared_terms(keep, rows(w), None if is_weights is None else rows(is_weights))
    return {b: _sequence_proxies(rows(a), keep, shared) for b, a in advantages.items()}


def _shared_terms(keep: Tensor, w: Tensor, is_weights: Tensor | None) -> dict[str, Tensor]:
    """The advantage-free terms over sequences that all have a generated token (`keep`: the
    `[N, T]` mask as booleans)."""
    if is_weights is None:
        w_scaled = w
        rho_bar2 = torch.ones(keep.shape[0], dtype=w.dtype)
        energy = _masked_sum(w, keep)  # W_i
    else:
        rho2 = is_weights**2
        w_scaled = w * rho2  # w rho^2 in place of w
        rho_bar2 = _masked_mean(is_weights, keep) ** 2  # rhobar_i^2
        # verl recovers W_i by dividing w rho^2 back by rho^2 floored at 1e-10: exact unless
        # rho is about 0.
        energy = _masked_sum(w_scaled / rho2.clamp_min(_VERL_RHO2_FLOOR), keep)
    return {
        "w_scaled": w_scaled,
        "power_weight": rho_bar2 * energy.clamp_min(0.0),  # rhobar_i^2 max(W_i, 0)
        "expected_w": _masked_sum(w_scaled, keep).mean(),
    }


def _sequence_proxies(
    advantages: Tensor, keep: Tensor, shared: dict[str, Tensor]
) -> dict[str, float]:
    """The proxies that need no gradient, over sequences that all have a generated token."""
    a_bar2 = _masked_mean(advantages, keep) ** 2  # Abar_i^2
    values = {
        "proxy2_total_power": (shared["power_weight"] * a_bar2).mean(),
        "expected_a_squared": a_bar2.mean(),
        "expected_w": shared["expected_w"],
        "token_total_power": _masked_sum(shared["w_scaled"] * advantages**2, keep).mean(),
    }
    return {name: values[name].item() for name in _SEQUENCE_PROXIES}


def combine_proxies(parts: Sequence[tuple[dict[str, float], int]]) -> dict[str, float]:
    """The proxies of a batch from those of its parts, each `(proxies, n)` with `n` the number
    of its sequences that have a generated token: every proxy is a mean over those sequences, so
    the whole is the `n`-weighted mean of the parts (in float64). A part with `n = 0` carries
    verl's zeros and no weight; all parts empty gives zeros, as for an empty batch."""
    total = sum(n for _, n in parts)
    if len(parts) == 1:
        return dict(parts[0][0])
    if total == 0:
        return dict.fromkeys(_SEQUENCE_PROXIES, 0.0)
    return {
        name: math.fsum(p[name] * n for p, n in parts if n) / total for name in _SEQUENCE_PROXIES
    }
