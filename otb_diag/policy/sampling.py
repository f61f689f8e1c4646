"""Sampling responses from a causal LM with `generate`, and the per-token statistics of the
sampling policy recorded on the fly: the one sampler of `rollouts sample`, `train` and
`lab build`.

The policy is `π_t = softmax(z_t / τ)` (docs/theory.md §1). `generate` runs greedily
(`do_sample=False`) with one extra logits processor, `PolicySampler`, which at every step:

1. draws each row's token from the tempered logits `z/τ` (top-k / top-p truncated when asked)
   with a noise source of `otb_diag/policy/noise.py`: per-row streams (`RowNoise`: a row draws
   the same whatever rows share its batch) or torch's global RNG (`GlobalRng`: Hugging Face's
   own `do_sample=True` draw, bit for bit);
2. records `logprob = log π_t(y)` and `sum_pi2 = Σ_v π_t(v)²` of the *untruncated* tempered
   policy (what trainers recompute and what `energy`'s forward pass gives), with the formulas of
   `otb_diag/maths/energy/token_stats.py:stats_from_logits`, kept on the model's device until
   the batch ends (no copy, so no device sync, per step);
3. returns scores that are `0` at `y` and `−inf` elsewhere, so the greedy step picks `y`.

Memory: the processor keeps two `[B]` vectors per step; the `[B, V]` scores of a step are freed
before the next, so `[steps, B, V]` never exists (`output_scores` stays off).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from otb_diag.maths.energy.token_stats import stats_from_logits
from otb_diag.policy.causal_lm import causal_lm
from otb_diag.policy.noise import Noise
from otb_diag.policy.sampling_options import Sampling as Sampling  # re-exported


def row_seed(seed: int, prompt_index: int, sample: int) -> int:
    """The 63-bit seed of response `sample` to prompt `prompt_index` under the run's `seed`:
    a hash, so neighbouring seeds give unrelated streams and a resumed run draws the same."""
    digest = hashlib.sha256(f"otb-diag-sample:{seed}:{prompt_index}:{sample}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


def truncate(z: Tensor, top_k: int, top_p: float) -> Tensor:
    """Tempered logits `z [B, V]` with the tokens outside the top-k and outside the smallest set
    of cumulative probability ≥ top_p set to −inf (the most likely token always stays)."""
    if top_k > 0 and top_k < z.shape[-1]:
        kth = z.topk(top_k, dim=-1).values[..., -1:]  # [B, 1]
        z = z.masked_fill(z < kth, float("-inf"))
    if top_p < 1.0:
        sorted_z, order = z.sort(dim=-1, descending=True)
        cum = sorted_z.softmax(-1).cumsum(-1)
        drop = (cum - sorted_z.softmax(-1)) >= top_p  # mass before this token already ≥ top_p
        z = z.masked_fill(drop.scatter(-1, order, drop), float("-inf"))
    return z


class PolicySampler:
    """A `generate` logits processor that draws every row's token with `noise` and records
    `logprob` and `sum_pi2` of each step (see the module docstring)."""

    def __init__(self, noise: Noise, sampling: Sampling) -> None:
        self.noise = noise
        self.sampling = sampling
        self.logprobs: list[Tensor] = []  # one [B] per step, on the scores' device
        self.sum_pi2: list[Tensor] = []

    def __call__(self, input_ids: Tensor, scores: Tensor) -> Tensor:
        """scores: `[B, V]` fp32, `generate`'s own copy of the step's logits (after its default
        processors), overwritten with the forced scores and returned."""
        tau = self.sampling.temperature
        z = scores.float()  # [B, V]; tempered as HF's warper does it: scores / τ, skipped at τ = 1
        if tau != 1:
            z = z / tau
        if not self.sampling.from_policy:
            z = truncate(z, self.sampling.top_k, self.sampling.top_p)
        tokens = self.noise(z, len(self.logprobs))  # [B]: y ~ softmax(z/τ) (truncated when asked)
        del z
        stats = stats_from_logits(scores, tokens, tau)  # untruncated π_t = softmax(z/τ)
        self.logprobs.append(stats.logprob)
        self.sum_pi2.append(stats.sum_pi2)
        return scores.fill_(float("-inf")).scatter_(-1, tokens[:, None], 0.0)


@dataclass(frozen=True)
class Sample:
    """One sampled response: its token ids (ending with an EOS id unless `truncated`) and, per
    token, `logprob` and `sum_pi2` under `softmax(z/τ)`."""

    response_ids: list[int]
    logprobs: list[float]
    sum_pi2: list[float]
    truncated: bool


def sample_batch(
    model: nn.Module,
    prompts: Sequence[Sequence[int]],
    noise: Noise,
    sampling: Sampling,
    *,
    eos_ids: Sequence[int],
    pad_id: int,
) -> list[Sample]:
    """One response per prompt (repeat a prompt for a group), drawn with `noise` (with
    `RowNoise(seeds)`, row i from seed `seeds[i]`).

    prompts: B token-id lists, left-padded here to `[B, P]` with `pad_id` and masked.
    Responses end at the first id in `eos_ids` (kept, as trainers keep it) or after
    `sampling.max_new_tokens` tokens (`truncated`). A PEFT wrapper samples as its causal LM
    (`causal_lm`: its adapter active).
    """
    from transformers import GenerationConfig, LogitsProcessorList

    model = causal_lm(model)
    device = model.get_output_embeddings().weight.device
    width = max(len(p) for p in prompts)
    input_ids = torch.tensor([[pad_id] * (width - len(p)) + list(p) for p in prompts])
    attention_mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    sampler = PolicySampler(noise, sampling)
    config = GenerationConfig(
        do_sample=False,  # PolicySampler has already drawn the token: greedy picks it
        num_beams=1,
        max_new_tokens=sampling.max_new_tokens,
        eos_token_id=list(eos_ids),
        pad_token_id=pad_id,
    )
    with torch.no_grad():
        out = model.generate(
            input_ids=input_ids.to(device),
            attention_mask=attention_mask.to(device),
            generation_config=config,
            logits_processor=LogitsProcessorList([sampler]),
        )  # [B, P + steps]
    steps = len(sampler.logprobs)
    # [B, steps] each, copied off the device once per batch
    logprobs = torch.stack(sampler.logprobs, 1).cpu() if steps else torch.zeros(len(prompts), 0)
    sum_pi2 = torch.stack(sampler.sum_pi2, 1).cpu() if steps else torch.zeros(len(prompts), 0)
    eos = set(eos_ids)
    samples = []
    for i, row in enumerate(out[:, width:].tolist()):
        stop = next((t for t, tok in enumerate(row) if tok in eos), None)
        n = len(row) if stop is None else stop + 1
        samples.append(
            Sample(
                response_ids=row[:n],
                logprobs=logprobs[i, :n].tolist(),
                sum_pi2=sum_pi2[i, :n].tolist(),
                truncated=stop is None,
            )
        )
    return samples
