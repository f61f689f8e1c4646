"""What the baselines are subtracted from: per-token rewards, reward-to-go and group indices
(docs/theory.md §3). `[B, T]` tensors, row i a response, column t its response token t + 1."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from torch import Tensor


def returns_to_go(token_rewards: Tensor, mask: Tensor) -> Tensor:
    """`G_t = sum_{k>=t} mask_k r_k` for `token_rewards, mask: [B, T]` -> `[B, T]`.

    Rewards on mask-0 (tool or padding) tokens are dropped, as verl's OTB does, since those
    tokens carry no score (docs/theory.md §1).
    """
    return (token_rewards * mask).flip(-1).cumsum(-1).flip(-1)


def outcome_token_rewards(reward: Tensor, mask: Tensor) -> Tensor:
    """Place the outcome `reward: [B]` on the last generated token of each row of `mask: [B, T]`.

    Rows with no generated token get no reward. Returns `[B, T]`.
    """
    rewards = torch.zeros(mask.shape, dtype=reward.dtype, device=reward.device)
    if mask.shape[-1] == 0:  # no column at all (e.g. one empty response): nothing to place
        return rewards
    positions = torch.arange(mask.shape[-1], device=mask.device)
    last = torch.where(mask.bool(), positions, -1).amax(-1)  # [B], -1 when nothing was generated
    has_token = last >= 0
    rewards[has_token, last[has_token]] = reward[has_token]
    return rewards


def group_index(labels: Sequence | np.ndarray, device: torch.device | str | None = None) -> Tensor:
    """Map per-row group labels (verl's `uid`s, strings or ints) to indices `0..K-1`: `[B]` long."""
    inverse = np.unique(np.asarray(labels), return_inverse=True)[1]
    return torch.as_tensor(inverse.reshape(-1), dtype=torch.long, device=device)
