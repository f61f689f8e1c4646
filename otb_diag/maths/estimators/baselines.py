"""Sequence-level baselines: none, mean (Dr.GRPO), grpo, TRL's two other scalings of it
(grpo-unscaled, grpo-batch), rloo and the optimal sequence baseline (docs/theory.md §3). The
token-level Optimal Token Baseline is in `otb.py`; the registry and what each entry declares in
`registry.py`.

Every baseline takes `returns` (reward-to-go `G_t` on every position, as `returns_to_go` gives
them), `mask` (1 on policy-generated tokens), `group` (each row's group index in `0..K-1`) and
`energy`, the cumulative realized energy `W_t = sum_{j<=t} mask_j w_j` over the whole row (as
`cumulative_energy` gives it; its last column is the sequence energy `W(tau)`), and returns
`[B, T]` advantages `(G_t - B_t) * mask_t`. A sequence's return `R_i` is `G_0`.

Every group statistic is a segment sum over `group` (`groups.py`), so no Python loop runs per
group. Conventions follow verl (`verl/trainer/ppo/core_algos.py`): groups of one get `B = 0`.
"""

from __future__ import annotations

import torch
from torch import Tensor

from otb_diag.errors import InputError
from otb_diag.maths.energy.token_stats import cumulative_energy
from otb_diag.maths.estimators.registry import SEQUENCE_NORM, TOKEN_NORMS, register_baseline
from otb_diag.maths.groups import block_size, group_total, weighted_group_mean


def _sequence_return(returns: Tensor) -> Tensor:
    """`R_i = G_0^(i)`: `[B, T] -> [B]`."""
    return returns[:, 0]


def require_energy(energy: Tensor | None, name: str) -> Tensor:
    if energy is None:
        raise InputError(f"baseline '{name}' needs the realized energy W", field="energy")
    return energy


def reweight_energy(energy: Tensor, mask: Tensor, is_weights: Tensor | None) -> Tensor:
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


@register_baseline("grpo", verl=("grpo",), trainers={"trl": {"eps": 1e-4}})
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


def trl_group_mean(r: Tensor, group: Tensor) -> Tensor:
    """`mean_{j ∈ group(i)} R_j` per row, `[B] -> [B]`, summed as TRL 1.16 sums it: `nanmean`
    over the `[K, n]` view of consecutive groups of n (`groups.block_size`), its float32
    order, so that the audit of a CPU trainer finds max |δ| = 0 (another order differs in the
    last bit for groups of 16); segment sums for any other grouping. A group of one is its own
    mean (TRL's convention: advantage 0; verl's `mean` gives it B = 0)."""
    r = r.contiguous()  # `G_0` is a column of `[B, T]`: TRL reduces a contiguous vector
    n = block_size(group)
    if n is not None:
        return torch.nanmean(r.view(-1, n), dim=1).repeat_interleave(n)
    return group_total(r, group) / group_total(torch.ones_like(r), group)


@register_baseline("grpo-unscaled", default=False, trainers={"trl-none": {}})
def grpo_unscaled_advantage(
    returns: Tensor, mask: Tensor, group: Tensor, energy: Tensor | None
) -> Tensor:
    """TRL's `scale_rewards="none"` (Dr. GRPO): `A_i = R_i − mean_group R`, no std, broadcast
    over the generated tokens; the group mean summed as TRL sums it (`trl_group_mean`). The
    registry's `mean` in exact arithmetic, but for a group of one, whose advantage is 0 here.
    """
    r = _sequence_return(returns)
    return (r - trl_group_mean(r, group))[:, None] * mask


@register_baseline("grpo-batch", default=False, trainers={"trl-batch": {"eps": 1e-4}})
def grpo_batch_advantage(
    returns: Tensor, mask: Tensor, group: Tensor, energy: Tensor | None, *, eps: float = 1e-4
) -> Tensor:
    """TRL's `scale_rewards="batch"`: `A_i = (R_i − mean_group R) / (std_batch R + ε)`, the
    group's mean over the std of every reward of the batch (the rows given at once: the live
    audit's step, TRL's generation batch; offline, one step at a time), broadcast over the
    generated tokens.

    TRL 1.16's conventions (`trl.trainer.utils.nanstd`): the std is unbiased,
    `√(mean_j (R_j − R̄)² · n/(n − 1))` over the batch's n rows, computed in that order, and 0
    for a batch of one row; ε = 1e-4; the group mean as `trl_group_mean` sums it.
    """
    r = _sequence_return(returns).contiguous()
    std = torch.zeros(()) if r.numel() <= 1 else _trl_std(r)  # TRL's std of one reward: 0
    return ((r - trl_group_mean(r, group)) / (std + eps))[:, None] * mask


def _trl_std(r: Tensor) -> Tensor:
    """The unbiased std of `r` `[n]`, n ≥ 2, in TRL 1.16's float32 order (`nanstd`)."""
    variance = torch.nanmean((r - torch.nanmean(r)) ** 2)  # mean_j (R_j − R̄)²
    count = (~torch.isnan(r)).sum()
    return (variance * (count / (count - 1))).sqrt()  # Bessel: · n/(n − 1)


@register_baseline("rloo", verl=("rloo",), trainers={"trl-rloo": {}})
def rloo_baseline(returns: Tensor, mask: Tensor, group: Tensor, energy: Tensor | None) -> Tensor:
    """`B_i = mean_{j != i} R_j` (leave-one-out, exactly unbiased); a group of one gets `B = 0`."""
    return _mean_advantage(returns, mask, group, leave_one_out=True)


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
        sequence_energy = reweight_energy(energy, mask, is_weights)[:, -1]  # W(tau) = W_T
    r = _sequence_return(returns)
    ones = torch.ones_like(r)
    baseline = weighted_group_mean(
        r, sequence_energy, ones, group, ones, eps=eps, leave_one_out=leave_one_out
    )
    return (returns - baseline[:, None]) * mask


@register_baseline("optseq", needs_energy=True, true_energies=(TOKEN_NORMS, SEQUENCE_NORM))
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

    `energy` is the cumulative `W: [B, T]` (its last column is `W(tau)`: the proxy's, or
    `sum_t ||s_t||^2`, no cross terms) or any per-sequence energy `[B]`, such as the sequence
    score's `||grad log pi(tau)||^2 = ||sum_t s_t||^2` of the classic optimal baseline (cross
    terms in; importance weights, if any, already in it). A group of one gets `B = 0`.
    """
    energy = require_energy(energy, "optseq")
    return _optseq_advantage(returns, mask, group, energy, is_weights, eps=eps, leave_one_out=False)


@register_baseline("optseq-loo", needs_energy=True, default=False)
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
    energy = require_energy(energy, "optseq-loo")
    return _optseq_advantage(returns, mask, group, energy, is_weights, eps=eps, leave_one_out=True)
