"""From validated, tokenized rollouts to the padded `[B, T]` tensors of `maths.response_batch`:
row i is response i of the file (file order)."""

from __future__ import annotations

import torch
from torch import Tensor

from otb_diag.io.rollouts.readers import Rollouts
from otb_diag.io.rollouts.rows import Response
from otb_diag.maths.response_batch import ResponseBatch, pad
from otb_diag.maths.returns import outcome_token_rewards


def make_batch(rollouts: Rollouts) -> ResponseBatch:
    """Tensors of tokenized rollouts (every response has `prompt_ids` and `response_ids`)."""
    rs = rollouts.responses
    missing = [r.source_row for r in rs if r.response_ids is None or r.prompt_ids is None]
    if missing:
        raise ValueError(f"rows {missing[:5]} are not tokenized: call tokenize_rollouts first")
    names = list(dict.fromkeys(r.group for r in rs))  # in order of first appearance
    index = {name: k for k, name in enumerate(names)}
    length = torch.tensor([len(r.response_ids) for r in rs], dtype=torch.long)
    # At least one (padding) column when every response is empty (all generations aborted):
    # every [B, T] formula, a baseline's G_0 or W_T, then has a column to read.
    width = max(1, int(length.max())) if len(rs) else 0
    valid = torch.arange(width)[None, :] < length[:, None]
    tool_mask = pad(
        [r.mask if r.mask is not None else [1] * len(r.response_ids) for r in rs], width
    )
    mask = tool_mask * valid

    # An outcome reward sits on the last generated token; explicit token rewards win over it.
    outcome = torch.tensor([r.reward or 0.0 for r in rs], dtype=torch.float32)
    token_rewards = outcome_token_rewards(outcome, mask)
    given = [i for i, r in enumerate(rs) if r.token_rewards is not None]
    if given:
        token_rewards[given] = pad([rs[i].token_rewards for i in given], width)
    reward = (token_rewards * mask).sum(-1)

    def optional(name: str, fill: float) -> Tensor | None:
        values = [getattr(r, name) for r in rs]
        return None if any(v is None for v in values) else pad(values, width, fill)

    return ResponseBatch(
        group_names=names,
        group=torch.tensor([index[r.group] for r in rs], dtype=torch.long),
        sample=torch.tensor([r.sample for r in rs], dtype=torch.long),
        length=length,
        prompt_ids=[list(r.prompt_ids) for r in rs],
        response_ids=pad([r.response_ids for r in rs], width, 0, torch.long),
        valid=valid,
        mask=mask,
        token_rewards=token_rewards,
        reward=reward,
        temperature=torch.tensor([r.temperature for r in rs], dtype=torch.float32),
        step=[r.step for r in rs],
        is_weights=optional("is_weights", 1.0),
        logprobs=optional("logprobs", 0.0),
        sum_pi2=optional("sum_pi2", 0.0),
        trainer_advantage=_trainer_advantage(rs, width),
    )


def _trainer_advantage(rs: list[Response], width: int) -> Tensor | None:
    """`[B, width]`: a per-response advantage repeated over its tokens, or the per-token list."""
    if any(r.trainer_advantage is None for r in rs):
        return None
    return pad(
        [
            a if isinstance(a := r.trainer_advantage, list) else [a] * len(r.response_ids)
            for r in rs
        ],
        width,
    )
