"""The policy-gradient surrogate loss whose gradient is the estimate ĝ (docs/theory.md §3), and the
differentiable log-probabilities of sampled responses it needs."""

from __future__ import annotations

import torch
from torch import Tensor
from transformers import PreTrainedModel

from otb_diag.maths.aggregation import aggregation_weights
from otb_diag.maths.response_batch import ResponseBatch
from otb_diag.policy.forward_pass import pad_batch


def _response_logprobs(model: PreTrainedModel, batch: ResponseBatch) -> Tensor:
    """`[B, T]` tempered `log π_θ(y_t | x, y_<t) = log_softmax(z_t / τ)[y_t]`, differentiable,
    0 on padding. One right-padded forward pass over `prompt ⧺ response` rows."""
    responses = [
        ids[:n] for ids, n in zip(batch.response_ids.tolist(), batch.length.tolist(), strict=True)
    ]
    input_ids, attention_mask, start = pad_batch(batch.prompt_ids, responses)  # [B, L], [B]
    positions = torch.arange(input_ids.shape[1]).expand_as(input_ids)  # right padding: 0 … L−1
    logits = model(
        input_ids=input_ids,
        attention_mask=attention_mask,
        position_ids=positions,
        use_cache=False,
    ).logits  # [B, L, V]
    # Response token t (0-based) sits at start + t and is predicted by the logits one before it;
    # padding slots are clamped into range and zeroed below.
    t = torch.arange(batch.response_ids.shape[1])
    where = (start[:, None] + t[None] - 1).clamp(max=input_ids.shape[1] - 1)  # [B, T]
    z = logits.gather(1, where[..., None].expand(-1, -1, logits.shape[-1]))  # [B, T, V]
    z = z / batch.temperature[:, None, None]  # z_t / τ
    logp = torch.log_softmax(z, -1).gather(-1, batch.response_ids[..., None])[..., 0]
    return torch.where(batch.valid, logp, 0.0)


def surrogate_loss(
    model: PreTrainedModel, batch: ResponseBatch, advantages: Tensor, aggregation: str
) -> Tensor:
    """`L(θ) = −Σ_{i,t} c_{i,t} · A_{i,t} · log π_θ(y_t)`, c = `aggregation_weights`.

    A and c are constants of the sampled batch, so `∇L = −Σ c A ∇log π = −ĝ`: a descent step on
    L is an ascent step along the policy-gradient estimate ĝ of docs/theory.md §3, and ‖∇L‖ = ‖ĝ‖.
    """
    c = aggregation_weights(aggregation, batch.mask)  # [B, T], 0 off the mask
    return -(c * advantages * _response_logprobs(model, batch)).sum()
