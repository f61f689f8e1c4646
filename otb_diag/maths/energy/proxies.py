"""Forward-only gradient-variance proxies (docs/theory.md §4), as verl logs them.

Reproduces `compute_variance_proxy_metrics` in `verl/trainer/ppo/metric_utils.py` (verl 0.9.1,
tested against it in tests/maths/energy/test_proxies.py): every mean runs over every row of the
batch, a row with no generated token (an aborted generation, kept with an all-zero mask)
included, with `Ā_i = 0` and `W_i = 0`; verl's `w` is `1 − 2p + Σπ²`, the squared norm of the
gradient of `log p` with respect to the *tempered* logits `z/τ`. The `w` the rest of otb-diag
uses is that over τ², the gradient with respect to the raw logits (`token_stats.py`); under
verl's names (`proxy2_total_power`, `expected_w`) the numbers here are verl's, under our own
names (`logit_total_power`, `token_total_power`) ours. verl prefixes the names with
`variance_proxy/` (pass `prefix=` for that) and logs 0.0 for the proxies it cannot compute; here
those keys are left out instead.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import torch
from torch import Tensor

_VERL_MASKED_MEAN_EPS = 1e-8  # verl_F.masked_mean adds it to the token count
_VERL_RHO2_FLOOR = 1e-10  # verl divides w rho^2 by max(rho^2, 1e-10) to recover w


def _masked_mean(x: Tensor, keep: Tensor) -> Tensor:
    """Per-sequence masked mean, verl's way: `[B, T] -> [B]` (`keep`: the mask as booleans;
    0 for a row with no generated token)."""
    return _masked_sum(x, keep) / (keep.sum(-1).to(x.dtype) + _VERL_MASKED_MEAN_EPS)


def _masked_sum(x: Tensor, keep: Tensor) -> Tensor:
    return torch.where(keep, x, 0.0).sum(-1)


def variance_proxies(
    advantages: Tensor,
    mask: Tensor,
    w: Tensor,
    *,
    is_weights: Tensor | None = None,
    temperature: Tensor | float = 1.0,
    grad_norm: float | None = None,
    prefix: str = "",
) -> dict[str, float]:
    """verl's variance proxies plus two of ours, as plain floats.

    Args:
        advantages: `[B, T]` token advantages `A_t`.
        mask: `[B, T]` 1 on generated tokens.
        w: `[B, T]` per-token proxy `w_t = (1 − 2 p_t + Σπ²_t) / τ²` (not cumulative), the
            gradient's squared norm w.r.t. the raw logits, as `token_stats.py` computes it.
        is_weights: `[B, T]` truncated IS weights `rho_t`, or None on-policy.
        temperature: τ, a float or `[B]` per row; verl's `w` is `τ² w_t`.
        grad_norm: `||g||` of the batch gradient (a training log or an exact mode); without it
            `proxy1_signal_strength` and `proxy3_pure_noise` are left out.

    Returns, over all `N = B` rows, with `Abar_i` the masked mean of `A_t` (0 for an empty row),
    `W_i = sum_t mask_t w_t` (ours) and `V_i = τ_i² W_i` (verl's):
        proxy2_total_power  = mean_i Abar_i^2 max(V_i, 0); with IS
                              mean_i rhobar_i^2 Abar_i^2 max(V_i, 0), rhobar_i the masked mean
                              of rho_t (so its square, not the mean of rho^2)        [verl's]
        proxy1_signal_strength = grad_norm^2                                        [verl's]
        proxy3_pure_noise   = max(0, (proxy2 - proxy1) / (N - 1)), only when N > 1  [verl's]
        expected_a_squared  = mean_i Abar_i^2                                       [verl's]
        expected_w          = mean_i V_i; with IS verl uses sum_t mask_t rho_t^2 τ² w_t,
                              unclamped                                             [verl's]
        logit_total_power   = proxy2_total_power with W_i for V_i (= proxy2 / τ² at one τ) [ours]
        token_total_power   = mean_i sum_t mask_t w_t A_t^2 (w rho^2 with IS)        [ours]
    """
    tau = torch.as_tensor(temperature, dtype=w.dtype).expand(w.shape[0])
    metrics = proxies_by_baseline({"": advantages}, mask, w, is_weights, tau)[""]
    if grad_norm is not None:
        proxy1 = grad_norm**2  # ||gbar||^2
        metrics["proxy1_signal_strength"] = proxy1
        n_batch = mask.shape[0]  # verl's batch_size: every row, empty ones included
        if n_batch > 1:
            noise = (metrics["proxy2_total_power"] - proxy1) / (n_batch - 1)
            metrics["proxy3_pure_noise"] = max(0.0, noise)
    return {prefix + name: value for name, value in metrics.items()}


SEQUENCE_PROXIES = (
    "proxy2_total_power",
    "expected_a_squared",
    "expected_w",
    "logit_total_power",
    "token_total_power",
)


def proxies_by_baseline(
    advantages: Mapping[str, Tensor],
    mask: Tensor,
    w: Tensor,
    is_weights: Tensor | None = None,
    temperature: Tensor | None = None,
) -> dict[str, dict[str, float]]:
    """`variance_proxies` (without `grad_norm` and `prefix`) of each baseline's `[B, T]`
    advantages over one batch (`temperature`: `[B]` τ per row, None for 1): the terms that do
    not depend on the advantages (`W_i`, `expected_w`, `rhobar_i^2`, `w rho^2`) are computed
    once."""
    if mask.shape[0] == 0 or not advantages:
        return {b: dict.fromkeys(SEQUENCE_PROXIES, 0.0) for b in advantages}
    tau_sq = None if temperature is None else temperature.to(w.dtype) ** 2
    shared = _shared_terms(mask.bool(), w, is_weights, tau_sq)
    # Every baseline at once, `[n, B, T]`: one set of operations and one host read a batch,
    # not one per baseline (the live diagnostics compute them at every training step).
    values = _sequence_proxies(torch.stack(list(advantages.values())), mask.bool(), shared)
    by_baseline = zip(advantages, values, strict=True)
    return {b: dict(zip(SEQUENCE_PROXIES, v, strict=True)) for b, v in by_baseline}


def _shared_terms(
    keep: Tensor, w: Tensor, is_weights: Tensor | None, tau_sq: Tensor | None
) -> dict[str, Tensor]:
    """The advantage-free terms (`keep`: the `[B, T]` mask as booleans; `tau_sq`: `[B]` τ² or
    None for 1)."""
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
    to_verl = 1.0 if tau_sq is None else tau_sq  # our w (raw logits) times τ²: verl's w
    return {
        "w_scaled": w_scaled,
        "power_weight": rho_bar2 * energy.clamp_min(0.0),  # rhobar_i^2 max(W_i, 0)
        "verl_power_weight": rho_bar2 * (to_verl * energy).clamp_min(0.0),  # ... max(V_i, 0)
        "expected_w": (to_verl * _masked_sum(w_scaled, keep)).mean(),  # mean_i τ² Σ w ρ²
    }


def _sequence_proxies(
    advantages: Tensor, keep: Tensor, shared: dict[str, Tensor]
) -> list[list[float]]:
    """The proxies that need no gradient, each a mean over every row, of each baseline's
    advantages `[n, B, T]`: `[n]` lists of the `SEQUENCE_PROXIES` in order."""
    a_bar2 = _masked_mean(advantages, keep) ** 2  # Abar_i^2 [n, B], 0 for an empty row
    values = {
        "proxy2_total_power": (shared["verl_power_weight"] * a_bar2).mean(-1),
        "expected_a_squared": a_bar2.mean(-1),
        "expected_w": shared["expected_w"].expand(len(advantages)),
        "logit_total_power": (shared["power_weight"] * a_bar2).mean(-1),
        "token_total_power": _masked_sum(shared["w_scaled"] * advantages**2, keep).mean(-1),
    }
    return torch.stack([values[name] for name in SEQUENCE_PROXIES], -1).tolist()


def combine_proxies(parts: Sequence[tuple[dict[str, float], int]]) -> dict[str, float]:
    """The proxies of a batch from those of its parts, each `(proxies, n)` with `n` its number
    of rows: every proxy (and every part of one, e.g. `tables.ZERO_TAIL`'s) is a mean over the
    rows, so the whole is the `n`-weighted mean of the parts (in float64). A part with `n = 0`
    carries zeros and no weight; all parts empty gives zeros, as for an empty batch."""
    total = sum(n for _, n in parts)
    if len(parts) == 1:
        return dict(parts[0][0])
    names = parts[0][0]
    if total == 0:
        return dict.fromkeys(names, 0.0)
    return {name: math.fsum(p[name] * n for p, n in parts if n) / total for name in names}
