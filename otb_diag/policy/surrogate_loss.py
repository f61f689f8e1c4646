"""The policy-gradient surrogate loss whose gradient is the estimate ĝ (docs/theory.md §3), and the
differentiable log-probabilities of sampled responses it needs."""

from __future__ import annotations

import torch
from torch import Tensor
from transformers import PreTrainedModel

from otb_diag.maths.aggregation import aggregation_weights
from otb_diag.maths.response_batch import ResponseBatch
from otb_diag.policy.causal_lm import causal_lm
from otb_diag.policy.forward_pass import pad_batch
from otb_diag.policy.placement import host_batch, input_device, to_device


def _response_logprobs(model: PreTrainedModel, batch: ResponseBatch) -> Tensor:
    """`[B, T]` tempered `log π_θ(y_t | x, y_<t) = log_softmax(z_t / τ)[y_t]`, differentiable,
    0 on padding, on the model's device. One right-padded forward pass over `prompt ⧺ response`
    rows: the ids padded and indexed on the host, then sent to the model's device once."""
    responses = [
        ids[:n] for ids, n in zip(batch.response_ids.tolist(), batch.length.tolist(), strict=True)
    ]
    input_ids, attention_mask, start = pad_batch(batch.prompt_ids, responses)  # [B, L], [B]
    positions = torch.arange(input_ids.shape[1]).expand_as(input_ids)  # right padding: 0 … L−1
    # Response token t (0-based) sits at start + t and is predicted by the logits one before it;
    # padding slots are clamped into range and zeroed below.
    t = torch.arange(batch.response_ids.shape[1])
    where = (start[:, None] + t[None] - 1).clamp(max=input_ids.shape[1] - 1)  # [B, T]
    device = input_device(model)
    input_ids, attention_mask, positions, where, targets, tau, valid = (
        to_device(x, device)
        for x in (input_ids, attention_mask, positions, where, batch.response_ids,
                  batch.temperature, batch.valid)
    )  # fmt: skip
    logits = model(
        input_ids=input_ids,
        attention_mask=attention_mask,
        position_ids=positions,
        use_cache=False,
    ).logits  # [B, L, V]
    z = logits.gather(1, where[..., None].expand(-1, -1, logits.shape[-1]))  # [B, T, V]
    z = z / tau.to(z.device)[:, None, None]  # z_t / τ
    logp = torch.log_softmax(z, -1).gather(-1, targets.to(z.device)[..., None])[..., 0]
    return torch.where(valid.to(z.device), logp, 0.0)


def surrogate_loss(
    model: PreTrainedModel, batch: ResponseBatch, advantages: Tensor, aggregation: str
) -> Tensor:
    """`L(θ) = −Σ_{i,t} c_{i,t} · A_{i,t} · log π_θ(y_t)`, c = `aggregation_weights`.

    A and c are constants of the sampled batch, so `∇L = −Σ c A ∇log π = −ĝ`: a descent step on
    L is an ascent step along the policy-gradient estimate ĝ of docs/theory.md §3, and ‖∇L‖ = ‖ĝ‖.
    The batch and the advantages may be on any device; the loss is on the model's logits'. A
    PEFT wrapper runs as its causal LM (`causal_lm`: its adapter active, and trained).
    """
    batch = host_batch(batch)
    logp = _response_logprobs(causal_lm(model), batch)  # [B, T]
    c = aggregation_weights(aggregation, batch.mask).to(logp.device)  # [B, T], 0 off the mask
    return -(c * advantages.to(logp.device) * logp).sum()
