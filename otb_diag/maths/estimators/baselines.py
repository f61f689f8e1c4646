"""Returns, group baselines and the Optimal Token Baseline (docs/theory.md §3).

Every baseline is one function registered under its name with `@register_baseline`:

    fn(returns: [B, T], mask: [B, T], group: [B] long, energy: [B, T] | None, **options)
        -> advantages [B, T] = (G_t - B_t) * mask_t

`returns` are reward-to-go `G_t` defined on every position (as `returns_to_go` gives them),
`mask` is 1 on policy-generated tokens, `group` holds each row's group index in `0..K-1`, and
`energy` is the cumulative realized energy `W_t = sum_{j<=t} mask_j w_j` over the whole row
(as `cumulative_energy` gives it), so its last column is the sequence energy `W(tau)`.
A sequence's return `R_i` is `G_0` (the sum of its masked rewards).

Every group statistic is a segment sum over `group` (`groups.py`), so no Python loop runs per
group. Conventions follow verl (`verl/trainer/ppo/core_algos.py`): groups of one get `B = 0`;
see `otb` for the OTB options and `verl_otb_advantage` for verl's calling convention.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from otb_diag.errors import InputError
from otb_diag.maths.energy.token_stats import cumulative_energy, proxy_from_probs
from otb_diag.maths.groups import group_total, weighted_group_mean, zero_tail
from otb_diag.maths.returns import returns_to_go

BaselineFn = Callable[..., Tensor]

BASELINES: dict[str, BaselineFn] = {}


def register_baseline(name: str) -> Callable[[BaselineFn], BaselineFn]:
    """Decorator adding `fn` to `BASELINES` under `name` (a name can be registered once)."""

    def decorator(fn: BaselineFn) -> BaselineFn:
        if name in BASELINES:
            raise ValueError(f"baseline '{name}' is already registered to {BASELINES[name]}")
        BASELINES[name] = fn
        return fn

    return decorator


def get_baseline(name: str) -> BaselineFn:
    """The baseline registered under `name`; an unknown name lists the known ones."""
    if name not in BASELINES:
        raise InputError(
            f"unknown baseline '{name}'; known baselines: {', '.join(sorted(BASELINES))}",
            field="baseline",
        )
    return BASELINES[name]


def compute_advantages(
    name: str, returns: Tensor, mask: Tensor, group: Tensor, energy: Tensor | None, **options: Any
) -> Tensor:
    """`[B, T]` advantages of the baseline `name`, passing it only the options it takes, so one
    set of settings (`is_weights`, `handle_zero_tail`, `tir`, ...) can drive every baseline."""
    fn = get_baseline(name)
    accepted = inspect.signature(fn).parameters
    return fn(returns, mask, group, energy, **{k: v for k, v in options.items() if k in accepted})


def _sequence_return(returns: Tensor) -> Tensor:
    """`R_i = G_0^(i)`: `[B, T] -> [B]`."""
    return returns[:, 0]


def _require_energy(energy: Tensor | None, name: str) -> Tensor:
    if energy is None:
        raise InputError(f"baseline '{name}' needs the realized energy W", field="energy")
    return energy


def _reweight_energy(energy: Tensor, mask: Tensor, is_weights: Tensor | None) -> Tensor:
    """Cumulative `W` rebuilt with `w_t rho_t^2`: the per-token `mask_t w_t` are the increments
    of `W`, so weighting them before re-accumulating equals `cumulative_energy(w, mask, rho)`.
    """
    if is_weights is None:
        return energy
    increments = torch.diff(energy, dim=-1, prepend=torch.zeros_like(energy[:, :1]))
    return cumulative_energy(increments, mask, is_weights)


# ---------------------------------------------------------------------------------------------
# Sequence-level baselines
# ---------------------------------------------------------------------------------------------


@register_baseline("none")
def no_baseline(returns: Tensor, mask: Tensor, group: Tensor, energy: Tensor | None) -> Tensor:
    """Plain REINFORCE: `A_t = G_t * mask_t`."""
    return returns * mask


def _mean_advantage(returns: Tensor, mask: Tensor, group: Tensor, *, leave_one_out: bool) -> Tensor:
    r = _sequence_return(returns)
    ones = torch.ones_like(r)
    baseline = weighted_group_mean(r, ones, ones, group, ones, eps=0.0, leave_one_out=leave_one_out)
    return (returns - baseline[:, None]) * mask


@register_baseline("mean")
def mean_baseline(returns: Tensor, mask: Tensor, group: Tensor, energy: Tensor | None) -> Tensor:
    """`B = mean_j R_j` over the group (GRPO's centre, no std scaling; verl's Dr.GRPO).

    A group of one gets `B = 0`, as verl's GRPO sets its mean to 0.
    """
    return _mean_advantage(returns, mask, group, leave_one_out=False)


@register_baseline("rloo")
def rloo_baseline(returns: Tensor, mask: Tensor, group: Tensor, energy: Tensor | None) -> Tensor:
    """`B_i = mean_{j != i} R_j` (leave-one-out, exactly unbiased); a group of one gets `B = 0`."""
    return _mean_advantage(returns, mask, group, leave_one_out=True)


@register_baseline("grpo")
def grpo_advantage(
    returns: Tensor, mask: Tensor, group: Tensor, energy: Tensor | None, *, eps: float = 1e-6
) -> Tensor:
    """GRPO's advantage `(R - mean) / (std + eps)` broadcast over the generated tokens.

    verl's `compute_grpo_outcome_advantage` conventions: unbiased std (`torch.std`),
    `eps = 1e-6`, and a group of one gets mean 0 and std 1, so its advantage is `R / (1 + eps)`.
    The advantage is constant along t, so with token rewards it uses `R = G_0`, not `G_t`.
    """
    r = _sequence_return(returns)
    ones = torch.ones_like(r)
    mean = weighted_group_mean(r, ones, ones, group, ones, eps=0.0, leave_one_out=False)
    size = group_total(ones, group)
    # Two-pass unbiased variance: sum_j (R_j - mean)^2 / (n - 1); groups of one use std = 1.
    variance = group_total((r - mean) ** 2, group) / (size - 1).clamp_min(1)
    std = torch.where(size > 1, variance.sqrt(), 1.0)
    return ((r - mean) / (std + eps))[:, None] * mask


def _optseq_advantage(
    returns: Tensor,
    mask: Tensor,
    group: Tensor,
    energy: Tensor,
    is_weights: Tensor | None,
    *,
    eps: float,
    leave_one_out: bool,
) -> Tensor:
    if energy.dim() == 1:
        if is_weights is not None:
            raise InputError("per-token is_weights need per-token energy [B, T]", field="energy")
        sequence_energy = energy
    else:
        sequence_energy = _reweight_energy(energy, mask, is_weights)[:, -1]  # W(tau) = W_T
    r = _sequence_return(returns)
    ones = torch.ones_like(r)
    baseline = weighted_group_mean(
        r, sequence_energy, ones, group, ones, eps=eps, leave_one_out=leave_one_out
    )
    return (returns - baseline[:, None]) * mask


@register_baseline("optseq")
def optseq_baseline(
    returns: Tensor,
    mask: Tensor,
    group: Tensor,
    energy: Tensor | None,
    *,
    is_weights: Tensor | None = None,
    eps: float = 1e-8,
) -> Tensor:
    """Classic optimal sequence baseline `B = sum_j R_j W_j / (sum_j W_j + eps)`.

    `energy` is the cumulative `W: [B, T]` (its last column is `W(tau)`) or any per-sequence
    energy `[B]`, such as the true `||grad log pi(tau)||^2`. A group of one gets `B = 0`.
    """
    energy = _require_energy(energy, "optseq")
    return _optseq_advantage(returns, mask, group, energy, is_weights, eps=eps, leave_one_out=False)


@register_baseline("optseq-loo")
def optseq_loo_baseline(
    returns: Tensor,
    mask: Tensor,
    group: Tensor,
    energy: Tensor | None,
    *,
    is_weights: Tensor | None = None,
    eps: float = 1e-8,
) -> Tensor:
    """`optseq` without sequence i in its own baseline:
    `B_i = sum_{j!=i} R_j W_j / (sum_{j!=i} W_j + eps)`; `B = 0` when i is alone in its group.
    """
    energy = _require_energy(energy, "optseq-loo")
    return _optseq_advantage(returns, mask, group, energy, is_weights, eps=eps, leave_one_out=True)


# ---------------------------------------------------------------------------------------------
# Optimal Token Baseline
# ---------------------------------------------------------------------------------------------


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
    energy = _reweight_energy(energy, mask, is_weights)
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


@register_baseline("otb")
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
    energy = _require_energy(energy, "otb")
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


@register_baseline("otb-loo")
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
    energy = _require_energy(energy, "otb-loo")
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
