"""The Optimal Token Baseline (docs/theory.md §3): a baseline per position t, weighted by the
realized energy `W_t` of the group members still generating at t, with verl's options
(zero tail, importance weights `w·ρ²`, the TIR re-indexing of multi-turn tool use) and verl's
calling convention (`verl_otb_advantage`).
"""

from __future__ import annotations

import torch
from torch import Tensor

from otb_diag.maths.energy.token_stats import cumulative_energy, proxy_from_probs
from otb_diag.maths.estimators.baselines import require_energy, reweight_energy
from otb_diag.maths.estimators.registry import TOKEN_NORMS, register_baseline
from otb_diag.maths.groups import weighted_group_mean, zero_tail
from otb_diag.maths.returns import returns_to_go


def _token_baseline(
    returns: Tensor,
    energy: Tensor,
    mask: Tensor,
    group: Tensor,
    members: Tensor,
    *,
    eps: float,
    leave_one_out: bool,
    handle_zero_tail: bool,
) -> Tensor:
    """`B_t = sum_j G_t^j W_t^j mask_t^j / (sum_j W_t^j mask_t^j + eps)` on one time axis.

    All tensors `[B, T]` aligned on the same t; `members: [B]` count towards group size.
    """
    baseline = weighted_group_mean(
        returns,
        energy,
        mask.to(returns.dtype),
        group,
        members,
        eps=eps,
        leave_one_out=leave_one_out,
    )
    if handle_zero_tail:
        # Alone at t, the longest member would be its own baseline and its tail advantage would
        # vanish (G W / (W + eps) ~ G); verl sets B = 0 there instead.
        baseline = baseline.masked_fill(zero_tail(mask, group), 0.0)
    return baseline


def _generated_slots(mask: Tensor) -> tuple[Tensor, Tensor, int]:
    """Where each generated token lands when the row is re-indexed by generated-token count.

    Returns `(rows, slots)` for the mask-1 entries of `mask: [B, T]` in row-major order (the
    slot of token t is `sum_{k<=t} mask_k - 1`) and the longest count.
    """
    generated = mask.bool()
    slots = mask.long().cumsum(-1) - 1
    rows = torch.arange(mask.shape[0], device=mask.device)[:, None].expand_as(slots)
    width = int(generated.sum(-1).max()) if mask.numel() else 0
    return rows[generated], slots[generated], width


def _compact(x: Tensor, mask: Tensor) -> Tensor:
    """`x: [B, T]` re-indexed by generated-token count: `[B, L_max]`, zero beyond each length."""
    rows, slots, width = _generated_slots(mask)
    compact = x.new_zeros((x.shape[0], width))
    compact[rows, slots] = x[mask.bool()]
    return compact


def _expand(compact: Tensor, mask: Tensor) -> Tensor:
    """Inverse of `_compact`: back to the row's own time axis, zero on mask-0 tokens."""
    rows, slots, _ = _generated_slots(mask)
    x = compact.new_zeros(mask.shape)
    x[mask.bool()] = compact[rows, slots]
    return x


def _otb_advantage(
    returns: Tensor,
    mask: Tensor,
    group: Tensor,
    energy: Tensor,
    is_weights: Tensor | None,
    *,
    eps: float,
    leave_one_out: bool,
    handle_zero_tail: bool,
    tir: bool,
) -> Tensor:
    energy = reweight_energy(energy, mask, is_weights)
    options = {"eps": eps, "leave_one_out": leave_one_out, "handle_zero_tail": handle_zero_tail}
    if not tir:
        everyone = torch.ones_like(group, dtype=torch.bool)
        baseline = _token_baseline(returns, energy, mask, group, everyone, **options)
        return (returns - baseline) * mask
    # TIR: align members by generated-token count so tool outputs do not shift the time axis.
    compact_mask = _compact(mask, mask)
    compact_returns = _compact(returns, mask)
    # verl's TIR variant leaves rows with no generated token out of their group's size.
    nonempty = mask.sum(-1) > 0
    baseline = _token_baseline(
        compact_returns, _compact(energy, mask), compact_mask, group, nonempty, **options
    )
    return _expand((compact_returns - baseline) * compact_mask, mask)


@register_baseline(
    "otb",
    needs_energy=True,
    true_energies=(TOKEN_NORMS,),
    verl=("optimal_token_baseline", "tir_optimal_token_baseline"),
)
def otb_baseline(
    returns: Tensor,
    mask: Tensor,
    group: Tensor,
    energy: Tensor | None,
    *,
    is_weights: Tensor | None = None,
    eps: float = 1e-8,
    handle_zero_tail: bool = True,
    tir: bool = False,
) -> Tensor:
    """Optimal Token Baseline: `B_t = sum_j G_t^j W_t^j m_t^j / (sum_j W_t^j m_t^j + eps)` over
    the group members still generating at t (`m_t^j = 1`); groups of one get `B = 0`.

    Options (defaults give verl's `compute_optimal_token_baseline_advantage` /
    `compute_multi_turn_optimal_token_baseline_advantage` numbers):
    - `is_weights = rho: [B, T]`: `w_t rho_t^2` in place of `w_t` *before* accumulating, so
      `W_t = sum_{j<=t} m_j w_j rho_j^2` (verl's code; its docstring's `rho^2(t) W_t` is not what
      it computes).
    - `handle_zero_tail` (True): in a group with a strictly longest member, that member gets
      `B_t = 0` from index `L_2` on, `L_2` the second-largest count of generated tokens. verl's
      signatures disagree across versions (True in some, False in newer single-turn OTB).
    - `tir` (False): verl's TIR variant: re-index each row by generated-token count, compute
      `B` (and the zero tail) on that axis, map back; rows with no generated token do not count
      towards their group's size there (the single-turn variant counts them).
    """
    energy = require_energy(energy, "otb")
    return _otb_advantage(
        returns,
        mask,
        group,
        energy,
        is_weights,
        eps=eps,
        leave_one_out=False,
        handle_zero_tail=handle_zero_tail,
        tir=tir,
    )


@register_baseline("otb-loo", needs_energy=True, default=False)
def otb_loo_baseline(
    returns: Tensor,
    mask: Tensor,
    group: Tensor,
    energy: Tensor | None,
    *,
    is_weights: Tensor | None = None,
    eps: float = 1e-8,
    tir: bool = False,
) -> Tensor:
    """OTB without sequence i in its own baseline:
    `B_t^i = sum_{j!=i} G_t^j W_t^j m_t^j / (sum_{j!=i} W_t^j m_t^j + eps)`, and `B_t^i = 0`
    where no other member is generating at t (so no zero-tail option is needed).
    """
    energy = require_energy(energy, "otb-loo")
    return _otb_advantage(
        returns,
        mask,
        group,
        energy,
        is_weights,
        eps=eps,
        leave_one_out=True,
        handle_zero_tail=False,
        tir=tir,
    )


def verl_otb_advantage(
    token_level_rewards: Tensor,
    response_mask: Tensor,
    index: Tensor,
    old_log_probs: Tensor,
    sum_pi_squared: Tensor,
    rollout_is_weights: Tensor | None = None,
    handle_zero_tail: bool = True,
    epsilon: float = 1e-8,
    tir: bool = False,
) -> tuple[Tensor, Tensor]:
    """verl's calling convention for OTB (`tir=True`: its `tir_optimal_token_baseline`).

    Takes per-token `old_log_probs` and `sum_pi_squared` (`[B, T]`), builds
    `w_t = 1 - 2 exp(log p_t) + sum_pi2_t`, `W = cumulative_energy(w, mask, rho)` and
    `G = returns_to_go(r, mask)`, and returns `(advantages, returns)`, both `[B, T]`.
    `index: [B]` long group indices (see `group_index` for verl's `uid` strings).
    """
    w = proxy_from_probs(old_log_probs.exp(), sum_pi_squared)  # 1 − 2p + Σπ², verl's τ = 1 units
    energy = cumulative_energy(w, response_mask, rollout_is_weights)
    returns = returns_to_go(token_level_rewards, response_mask)
    advantages = otb_baseline(
        returns,
        response_mask,
        index,
        energy,
        eps=epsilon,
        handle_zero_tail=handle_zero_tail,
        tir=tir,
    )
    return advantages, returns
