"""CUDA against the CPU (issue 25): the statistics of `energy`, the scores of `variance-compare`
(proxy, head, full with both engines) and the statistics `rollouts sample` records, on the embedded
model and on random small Llama and Qwen2 configs, in float32 and bfloat16.

What must agree, and how closely:
- float32: CUDA and the CPU compute the same formulas with other kernels (TF32 is off by default for
  matmuls): every number within 1e-4 of its tensor's norm.
- bfloat16 (weights, activations and tangents; fp32 statistics): the same weights on the two
  devices differ by the kernels' bf16 rounding of the activations (3 significant digits), so the
  statistics agree within `BF16_REL` = 5e-2 of their tensor's norm: the documented bf16 error.
- full mode draws its directions on the device (CPU and CUDA generators differ for one seed), so
  projections are compared engine against engine on CUDA, and the exact per-token norms of the
  reverse engine, which do not depend on the directions, CUDA against the CPU.
- sampled tokens come from the device's generator: the statistics recorded while sampling on CUDA
  are compared with the CPU's statistics pass over the same tokens.

`OTB_TEST_GPU_DEVICE=cpu` runs the same comparisons CPU against CPU (a check of this file where no
GPU is at hand); by default the device is `cuda` and the tests skip, saying so, without it.
"""

from __future__ import annotations

import os

import pytest
import torch
from numerics import assert_close_to_norm
from torch import nn
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

from otb_diag.io.checkpoint import load_checkpoint
from otb_diag.io.scenarios import default_checkpoint
from otb_diag.maths.energy.token_stats import stats_from_logits
from otb_diag.maths.response_batch import ResponseBatch, pad
from otb_diag.policy.forward_pass import (
    checkpoint_stats,
    final_hidden,
    head_logits,
    output_layer,
    response_token_stats,
)
from otb_diag.policy.noise import RowNoise
from otb_diag.policy.sampling import Sampling, row_seed, sample_batch
from otb_diag.policy.scores.token_scores import proxy_scores, token_scores

DEVICE = torch.device(os.environ.get("OTB_TEST_GPU_DEVICE", "cuda"))
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(
        DEVICE.type == "cuda" and not torch.cuda.is_available(),
        reason="no CUDA device: these tests compare CUDA against the CPU",
    ),
]
F32_REL, BF16_REL = 1e-4, 5e-2
HALF_HEAD_REL = 1e-4  # fp32 sums in another order, relative to the norm (measured on CPU: < 2e-5)
SMALL = dict(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
             num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=False)  # fmt: skip


def embedded() -> nn.Module:
    return load_checkpoint(default_checkpoint(), dtype="float32").model.eval()


def llama() -> nn.Module:
    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(**SMALL)).eval()


def qwen2() -> nn.Module:
    torch.manual_seed(1)
    return Qwen2ForCausalLM(Qwen2Config(**{**SMALL, "tie_word_embeddings": True})).eval()


MODELS = [embedded, llama, qwen2]
DTYPES = [torch.float32, torch.bfloat16]


def pair(build, dtype: torch.dtype) -> tuple[nn.Module, nn.Module, float]:
    """The model on the CPU in fp32 (its weights rounded to `dtype` first) and on DEVICE in
    `dtype`, with the relative tolerance of the comparison."""
    model = build().to(dtype)
    return (
        model.float(),
        build().to(dtype).to(DEVICE),
        F32_REL if dtype is torch.float32 else (BF16_REL),
    )


def batch_of(vocab: int, rows: int = 6, seed: int = 0) -> ResponseBatch:
    """Responses of different lengths under prompts of different lengths, two groups."""
    gen = torch.Generator().manual_seed(seed)
    lengths = [5 + 3 * i for i in range(rows)]
    prompts = [torch.randint(1, vocab, (2 + i % 3,), generator=gen).tolist() for i in range(rows)]
    responses = [torch.randint(1, vocab, (n,), generator=gen).tolist() for n in lengths]
    return make_batch(prompts, responses, [0.7 + 0.2 * i for i in range(rows)])


def make_batch(prompts, responses, taus) -> ResponseBatch:
    n, width = len(responses), max(map(len, responses))
    length = torch.tensor([len(r) for r in responses])
    valid = torch.arange(width)[None] < length[:, None]
    zeros = torch.zeros(n, width)
    return ResponseBatch(
        group_names=["a", "b"], group=torch.arange(n) % 2, sample=torch.arange(n) // 2,
        length=length, prompt_ids=prompts, response_ids=pad(responses, width, 0, torch.long),
        valid=valid, mask=valid.float(), token_rewards=zeros, reward=torch.zeros(n),
        temperature=torch.tensor(taus), step=[None] * n, is_weights=None, logprobs=None,
        sum_pi2=None,
    )  # fmt: skip


@pytest.mark.parametrize("build", MODELS)
def test_half_head_product_against_the_upcast_one(build) -> None:
    """The bf16 head multiplied on DEVICE with fp32 accumulation (`forward_pass.py:head_logits`;
    on CUDA `torch.mm(..., out_dtype=float32)`) against the same bf16 values upcast and multiplied
    in fp32 on DEVICE: the same inputs, so the statistics agree to `HALF_HEAD_REL` of their norm
    (the CPU emulation of the summation order, tests/policy/test_head_precision.py, measured
    1.7e-5 of the largest value on SmolLM2)."""
    model = build().to(torch.bfloat16).to(DEVICE)
    vocab = model.config.vocab_size
    ids = torch.randint(1, vocab, (1, 65), generator=torch.Generator().manual_seed(4)).to(DEVICE)
    fast = response_token_stats(model, ids, torch.ones_like(ids), torch.tensor([1]))
    with torch.no_grad():
        h = final_hidden(model, ids, None)[0, :-1].float()
        weight, _, scale, softcap = output_layer(model)
        upcast = head_logits(h * scale, weight.float(), None, softcap)
        assert output_layer(model)[1] is None  # these models' heads have no bias
    want = stats_from_logits(upcast, ids[0, 1:])
    for name in ("logprob", "prob", "sum_pi2", "entropy", "w"):
        got = getattr(fast, name)[0].cpu()
        assert_close_to_norm(got, getattr(want, name).cpu(), rel=HALF_HEAD_REL, msg=name)


@pytest.mark.parametrize("dtype", DTYPES, ids=["fp32", "bf16"])
@pytest.mark.parametrize("build", MODELS)
def test_energy_statistics(build, dtype) -> None:
    cpu, dev, rel = pair(build, dtype)
    batch = batch_of(cpu.config.vocab_size)
    a, b = checkpoint_stats(cpu, batch), checkpoint_stats(dev, batch)
    for name in ("logprob", "prob", "sum_pi2", "entropy", "w", "h_sq"):
        assert getattr(b, name).device.type == "cpu"
        assert_close_to_norm(getattr(b, name), getattr(a, name), rel=rel, msg=name)


@pytest.mark.parametrize("dtype", DTYPES, ids=["fp32", "bf16"])
@pytest.mark.parametrize("build", MODELS)
def test_variance_compare_scores(build, dtype) -> None:
    cpu, dev, rel = pair(build, dtype)
    batch = batch_of(cpu.config.vocab_size)
    w_cpu, w_dev = checkpoint_stats(cpu, batch).w, checkpoint_stats(dev, batch).w
    assert_close_to_norm(proxy_scores(w_dev, 8, 0), proxy_scores(w_cpu, 8, 0), rel=rel, msg="proxy")
    head_cpu = token_scores(cpu, batch, "head", 16, seed=0)
    head_dev = token_scores(dev, batch, "head", 16, seed=0)
    assert_close_to_norm(head_dev.proj, head_cpu.proj, rel=rel, msg="head proj")
    assert_close_to_norm(head_dev.sq_norm, head_cpu.sq_norm, rel=rel, msg="head norm")
    kwargs = {"budget_s": None, "chunk_size": 4}
    vjp_cpu = token_scores(cpu, batch, "full", 8, seed=0, engine="vjp", **kwargs)
    vjp_dev = token_scores(dev, batch, "full", 8, seed=0, engine="vjp", **kwargs)
    jvp_dev = token_scores(dev, batch, "full", 8, seed=0, engine="jvp", budget_s=None)
    assert_close_to_norm(vjp_dev.sq_norm, vjp_cpu.sq_norm, rel=rel, msg="exact ‖s_t‖²")
    assert_close_to_norm(jvp_dev.proj, vjp_dev.proj, rel=rel, msg="jvp vs vjp on the device")


@pytest.mark.parametrize("dtype", DTYPES, ids=["fp32", "bf16"])
@pytest.mark.parametrize("build", MODELS)
def test_sampled_statistics(build, dtype) -> None:
    cpu, dev, rel = pair(build, dtype)
    vocab = cpu.config.vocab_size
    prompts = [[1, 2, 3], [4, 5], [6, 7, 8, 9]]
    never = vocab + 7  # an id never drawn: every row runs to max_new_tokens
    samples = sample_batch(dev, prompts, RowNoise([row_seed(0, i, 0) for i in range(3)]),
                           Sampling(0.8, 0, 1.0, 12), eos_ids=[never], pad_id=0)  # fmt: skip
    batch = make_batch(prompts, [s.response_ids for s in samples], [0.8] * 3)
    stats = checkpoint_stats(cpu, batch)
    logged = pad([s.logprobs for s in samples], batch.response_ids.shape[1])
    sum_pi2 = pad([s.sum_pi2 for s in samples], batch.response_ids.shape[1])
    assert_close_to_norm(logged, stats.logprob, rel=rel, msg="logprobs")
    assert_close_to_norm(sum_pi2, stats.sum_pi2, rel=rel, msg="sum_pi2")
