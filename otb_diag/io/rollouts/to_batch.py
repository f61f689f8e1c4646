"""From validated, tokenized rollouts to the padded `[B, T]` tensors of `maths.response_batch`:
row i is response i of the file (file order)."""

from __future__ import annotations

import torch
from torch import Tensor

from otb_diag.io.rollouts.readers import Rollouts
from otb_diag.io.rollouts.rows import Response
from otb_diag.maths.response_batch import ResponseBatch, pad


def make_batch(rollouts: Rollouts) -> ResponseBatch:
    """Tensors of tokenized rollouts (every response has `prompt_ids` and `response_ids`): the
    rows padded to the longest response, then `ResponseBatch.from_padded`."""
    rs = rollouts.responses
    missing = [r.source_row for r in rs if r.response_ids is None or r.prompt_ids is None]
    if missing:
        raise ValueError(f"rows {missing[:5]} are not tokenized: call tokenize_rollouts first")
    names = list(dict.fromkeys(r.group for r in rs))  # in order of first appearance
    index = {name: k for k, name in enumerate(names)}
    width = max((len(r.response_ids) for r in rs), default=0)

    def optional(name: str, fill: float) -> Tensor | None:
        values = [getattr(r, name) for r in rs]
        return None if any(v is None for v in values) else pad(values, width, fill)

    # An outcome reward sits on the last generated token; explicit token rewards win over it.
    given = [r.token_rewards is not None for r in rs]
    return ResponseBatch.from_padded(
        group_names=names,
        group=torch.tensor([index[r.group] for r in rs], dtype=torch.long),
        sample=torch.tensor([r.sample for r in rs], dtype=torch.long),
        prompt_ids=[list(r.prompt_ids) for r in rs],
        response_ids=pad([r.response_ids for r in rs], width, 0, torch.long),
        length=torch.tensor([len(r.response_ids) for r in rs], dtype=torch.long),
        temperature=torch.tensor([r.temperature for r in rs], dtype=torch.float32),
        step=[r.step for r in rs],
        tool_mask=pad(
            [r.mask if r.mask is not None else [1] * len(r.response_ids) for r in rs], width
        ),
        reward=torch.tensor([r.reward or 0.0 for r in rs], dtype=torch.float32),
        token_rewards=pad([r.token_rewards or [] for r in rs], width) if any(given) else None,
        has_token_rewards=torch.tensor(given, dtype=torch.bool),
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
