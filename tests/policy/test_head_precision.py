"""The output layer's product in the model's own precision (issue 41): a half-precision head is
multiplied on the tensor cores with fp32 accumulation and an fp32 result (`torch.mm(...,
out_dtype=torch.float32)`, CUDA only), where it used to be upcast and multiplied in fp32.

The two take the same inputs (a bf16 value upcasts exactly), so they differ only in the order of
the fp32 sums. The CPU has no such product, so these tests check
- which path each device takes (the meta device has the CUDA product's signature), and
- the numerics of the CUDA path by emulation: bf16 inputs, fp32 sums taken in blocks of the hidden
  width, as tensor cores accumulate, against today's upcast fp32 product, on a small random model
  and on SmolLM2-135M-Instruct from its GGUF in bf16 (the accuracy the docstring of
  `forward_pass.py:head_logits` states). `tests/gpu/test_cuda_matches_cpu.py` checks the real CUDA
  product.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import Tensor
from transformers import LlamaConfig, LlamaForCausalLM

from otb_diag.io.checkpoint import load_checkpoint
from otb_diag.maths.energy.token_stats import TokenStats, stats_from_logits
from otb_diag.policy.forward_pass import (
    final_hidden,
    head_logits,
    head_weight,
    output_layer,
    response_token_stats,
)

BLOCK = 16  # hidden units a tensor-core step sums before adding to the fp32 accumulator
# Statistics of the two orders, relative to each tensor's largest magnitude. Measured (CPU, 27 Nov):
# 3.5e-7 on the small model, 1.7e-5 on SmolLM2 (Σπ²; log p 7e-7, w 4e-6): the fp32 rounding of
# logits of magnitude ~30, which Σπ² = exp(lse(2z) − 2 lse(z)) doubles.
STAT_REL = 5e-5


def block_ordered_logits(h: Tensor, weight: Tensor) -> Tensor:
    """`[N, V]` fp32 `U h` of bf16 `h [N, d]` and `weight [V, d]`, summed `BLOCK` units at a time
    into an fp32 accumulator: the CUDA product's arithmetic in another order than one fp32 GEMM."""
    z = torch.zeros(h.shape[0], weight.shape[0])
    for lo in range(0, h.shape[1], BLOCK):
        z += h[:, lo : lo + BLOCK].float() @ weight[:, lo : lo + BLOCK].float().T
    return z


def assert_stats_close(got: TokenStats, want: TokenStats, rel: float) -> float:
    """Every statistic within `rel` of its tensor's largest magnitude; the largest such gap."""
    gaps = {}
    for name in ("logprob", "prob", "sum_pi2", "entropy", "w"):
        a, b = getattr(got, name).flatten(), getattr(want, name).flatten()
        gaps[name] = ((a - b).abs().max() / b.abs().max().clamp_min(1e-30)).item()
    assert max(gaps.values()) <= rel, f"gaps relative to each largest value: {gaps} (bound {rel:g})"
    return max(gaps.values())


def emulated_against_today(model: torch.nn.Module, n_tokens: int, seed: int) -> float:
    """The statistics of one bf16 row from today's fp32 product (`response_token_stats` on the
    CPU) and from the block-ordered one: their largest relative gap (asserted ≤ `STAT_REL`)."""
    vocab = model.config.vocab_size
    ids = torch.randint(vocab, (1, n_tokens + 1), generator=torch.Generator().manual_seed(seed))
    today = response_token_stats(model, ids, torch.ones_like(ids), torch.tensor([1]))
    with torch.no_grad():
        h = final_hidden(model, ids, None)[0, :-1]  # [T, d] bf16, predicting ids[0, 1:]
        weight = output_layer(model)[0]
        z = block_ordered_logits(h, weight)
    emulated = stats_from_logits(z, ids[0, 1:])
    return assert_stats_close(emulated, today, STAT_REL)


def test_the_cpu_upcasts_a_half_head_once_and_keeps_an_fp32_head():
    weight = torch.randn(8, 4)
    assert head_weight(weight).data_ptr() == weight.data_ptr()  # no copy
    half = weight.bfloat16()
    upcast = head_weight(half)
    assert upcast.dtype == torch.float32
    torch.testing.assert_close(upcast, half.float(), rtol=0, atol=0)  # exact


def test_a_device_with_the_mixed_product_multiplies_the_half_weight_itself():
    # The meta device has CUDA's `mm(..., out_dtype=float32)` signature: the path CUDA takes.
    weight = torch.empty(50, 16, dtype=torch.bfloat16, device="meta")
    assert head_weight(weight).dtype == torch.bfloat16  # no fp32 copy of [V, d]
    h = torch.empty(7, 16, dtype=torch.bfloat16, device="meta")
    out = torch.empty(7, 50, device="meta")
    z = head_logits(h, head_weight(weight), torch.empty(50, device="meta"), 30.0, out=out)
    assert z.dtype == torch.float32 and z.shape == (7, 50) and z.data_ptr() == out.data_ptr()


def test_scale_bias_and_softcap_read_as_the_model_applies_them():
    g = torch.Generator().manual_seed(3)
    h, weight, bias = torch.randn(5, 6, generator=g), torch.randn(9, 6, generator=g), None
    z = head_logits(h, weight, bias, softcap=2.0, scale=0.5)
    torch.testing.assert_close(z, 2.0 * torch.tanh((0.5 * h @ weight.T) / 2.0))
    bias = torch.randn(9, generator=g)
    torch.testing.assert_close(head_logits(h, weight, bias, None), h @ weight.T + bias)


def test_block_ordered_sums_match_todays_product_on_a_small_bf16_model():
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2,
    )  # fmt: skip
    model = LlamaForCausalLM(config).to(torch.bfloat16).eval()
    emulated_against_today(model, n_tokens=96, seed=1)


@pytest.mark.slow  # loads SmolLM2 and scores 256 tokens over V = 49,152
def test_block_ordered_sums_match_todays_product_on_smollm2_in_bf16(smollm2_fp32: Path):
    model = load_checkpoint(smollm2_fp32, dtype="float32").model.to(torch.bfloat16).eval()
    worst = emulated_against_today(model, n_tokens=256, seed=2)
    print(f"SmolLM2 bf16: block-ordered fp32 sums vs today's fp32 product: {worst:.2e}")
