"""Statistics over the members of each group, as segment sums over the group index (`index_add_`,
`scatter_reduce`), so no Python loop runs per group (docs/theory.md §3).

`group: [B]` long holds each row's group index in `0..K-1`; every function returns one value per
row (its group's statistic), ready to subtract.
"""

from __future__ import annotations

import torch
from torch import Tensor


def group_total(x: Tensor, group: Tensor) -> Tensor:
    """For each row, the sum of `x` over the rows of its group: `[B, ...] -> [B, ...]`."""
    num_groups = int(group.max()) + 1 if group.numel() else 0
    totals = x.new_zeros((num_groups, *x.shape[1:])).index_add_(0, group, x)
    return totals[group]


def block_size(group: Tensor) -> int | None:
    """n when `group` `[B]` is `0…0 1…1 …` in consecutive blocks of n rows each (a trainer's
    generation batch: TRL's, verl's), else None."""
    rows = group.numel()
    if rows == 0 or int(group[0]) != 0:
        return None
    n = rows // (int(group[-1]) + 1)
    if n * (int(group[-1]) + 1) != rows:
        return None
    return n if torch.equal(group, torch.arange(rows, device=group.device) // n) else None


def weighted_group_mean(
    values: Tensor,
    weights: Tensor,
    present: Tensor,
    group: Tensor,
    members: Tensor,
    *,
    eps: float,
    leave_one_out: bool,
) -> Tensor:
    """`B_i = sum_j w_j v_j / (sum_j w_j + eps)` over the present members `j` of `i`'s group.

    `values, weights, present` are `[B]` (one value per sequence) or `[B, T]` (one per position,
    `present = mask`); `members: [B]` says which rows count towards the group size.
    Leave-one-out drops `j = i` and gives `B = 0` where no other member is present.
    Groups of one get `B = 0` (verl's convention).
    """
    weighted = weights * present
    numerator = group_total(values * weighted, group)
    denominator = group_total(weighted, group)
    if leave_one_out:
        others = group_total(present, group) - present
        baseline = (numerator - values * weighted) / (denominator - weighted + eps)
        baseline = torch.where(others > 0, baseline, 0.0)
    else:
        baseline = numerator / (denominator + eps)
    group_size = group_total(members.to(values.dtype), group)
    keep = (group_size > 1).view(-1, *([1] * (values.dim() - 1)))
    return torch.where(keep, baseline, 0.0)


def zero_tail(mask: Tensor, group: Tensor) -> Tensor:
    """`[B, T]` bool: positions `t >= L_2` of a group's strictly longest member, where lengths
    `L_i = sum_t mask_t` count generated tokens and `L_2` is the group's second-largest length.

    verl cuts at index `L_2` of the row's own time axis, even when mask has holes.
    """
    lengths = mask.sum(-1).long()
    num_groups = int(group.max()) + 1
    longest = lengths.new_full((num_groups,), -1).scatter_reduce(0, group, lengths, "amax")
    is_longest = lengths == longest[group]
    # With a unique longest member every other member is shorter, so this is the second length.
    others = torch.where(is_longest, -1, lengths)
    second = lengths.new_full((num_groups,), -1).scatter_reduce(0, group, others, "amax")[group]
    unique = group_total(is_longest.long(), group) == 1
    positions = torch.arange(mask.shape[-1], device=mask.device)
    return (is_longest & unique)[:, None] & (positions[None, :] >= second[:, None])
