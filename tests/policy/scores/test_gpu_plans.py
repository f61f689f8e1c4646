"""The plans of `bench/gpu.py`'s rows, computed on the CPU for the real shapes (issue 48): pure
functions of (shape, device kind, free memory, dtype), so a change that would slow a GPU row
fails here though the suite never sees a GPU.

The models are built on the meta device with `bench/gpu.py`'s shapes (Qwen2.5-1.5B, Qwen3-8B,
SmolLM2-1.7B; bf16, as the rows run them); free memory as the rows see it, the model loaded: an
H100 80 GB between 70 and 76 GiB, an H200 between 125 and 136 GiB. Forward mode on a GPU is bound
by its host (bench/README.md, issue 48: each vmapped jvp call costs the host a few tenths of a
second of Python and dispatch, and each query chunk of each layer adds to it), so its good plan
makes few calls of many directions and few query chunks: at T = 2,048 one chunk (the cap of 2^24
scores cut it in 4) and 8 (H100) or 16 (H200) directions a call (the tangents' memory had been
counted twice over, which gave 4 or 8)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

from otb_diag.policy.forward_pass import (
    MAX_BATCH_TOKENS,
    MAX_STATS_CHUNK,
    head_product_dtype,
    stats_layout,
)
from otb_diag.policy.scores import cost
from otb_diag.policy.scores.chunked_attention import SCORES_PER_CHUNK
from otb_diag.policy.scores.directions import Block, select_parameters
from otb_diag.policy.scores.forward_mode import HEAD_CHUNK

GIB = 2**30
CARDS = {"H100": (70 * GIB, 76 * GIB), "H200": (125 * GIB, 136 * GIB)}
BENCH = Path(__file__).resolve().parents[3] / "bench"


@pytest.fixture(scope="module")
def shapes() -> dict:
    """`bench/gpu.py`'s SHAPES (one declaration of the rows' models)."""
    name = "bench_gpu_for_plans"
    sys.path.insert(0, str(BENCH))
    try:
        spec = importlib.util.spec_from_file_location(name, BENCH / "gpu.py")
        module = sys.modules[name] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(BENCH))
        sys.modules.pop(name, None)
    return module.SHAPES


def shaped(shapes: dict, name: str) -> nn.Module:
    config_cls, model_cls, kwargs = shapes[name]
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        with torch.device("meta"):
            return model_cls(config_cls(**kwargs))
    finally:
        torch.set_default_dtype(default)


def layout(shapes, name: str, rows: int, tokens: int, k: int, free: float, device="cuda"):
    """The plan of `rows` responses of `tokens` tokens after bench_full's 8-token prompts."""
    model = shaped(shapes, name)
    params = select_parameters(model, None)
    shape = cost.ModelShape.of(model, params, [Block("all", tuple(params), k, 0)])
    return cost.forward_layout(shape, [(8, tokens)] * rows, device, free)


@pytest.mark.parametrize("card", CARDS)
def test_full_mode_at_2048_tokens_is_one_query_chunk_of_many_directions(shapes, card) -> None:
    """Qwen2.5-1.5B, one response of 2,048 tokens, k = 64: every layer's attention in one query
    chunk (no device read for its keys), the row's logits in one head chunk, 8 directions a call
    on an H100 and 16 on an H200, within `MEMORY_SHARE` of the memory."""
    for free in CARDS[card]:
        plan = layout(shapes, "qwen2.5-1.5b", 1, 2048, 64, free)
        assert plan.query_chunks == 1
        assert plan.directions_batch == {"H100": 8, "H200": 16}[card]
        assert plan.head_chunk >= 2048 + 8
        assert plan.peak_bytes <= cost.MEMORY_SHARE * free
        short = layout(shapes, "qwen2.5-1.5b", 1, 512, 64, free)
        assert short.query_chunks == 1 and short.directions_batch == plan.directions_batch


@pytest.mark.parametrize("card", CARDS)
def test_full_mode_at_8192_tokens_and_the_smollm2_batch(shapes, card) -> None:
    """T = 8,192 (k = 16): at most 13 query chunks a layer (49 under the old cap) and at least 4
    directions a call; the SmolLM2-1.7B batch (64 × 512, k = 16): 2 query chunks a layer (16
    under the old cap) over packed batches of 16,384 tokens, 4 (H100) or 8 (H200) directions."""
    for free in CARDS[card]:
        long = layout(shapes, "qwen2.5-1.5b", 1, 8192, 16, free)
        assert long.query_chunks <= 13 and long.directions_batch >= 4
        assert long.peak_bytes <= cost.MEMORY_SHARE * free
        batch = layout(shapes, "smollm2-1.7b", 64, 512, 16, free)
        assert batch.query_chunks <= 2 and len(batch.groups) == 3
        assert batch.directions_batch == {"H100": 4, "H200": 8}[card]


def test_the_cpu_keeps_its_cache_sized_plan(shapes) -> None:
    """The CPU's rows (`bench_full.py`) are bound by arithmetic in its caches: 8 directions a
    call, 1,024-token batches, 256-token head chunks and `SCORES_PER_CHUNK` scores, however much
    memory the host has."""
    plan = layout(shapes, "qwen2.5-1.5b", 1, 2048, 64, 100 * GIB, device="cpu")
    assert (plan.directions_batch, plan.batch_tokens, plan.head_chunk) == (8, 1024, HEAD_CHUNK)
    assert plan.attention_scores == SCORES_PER_CHUNK


def test_tangents_are_counted_once_in_their_dtype(shapes) -> None:
    """A direction's tangent is the block in the parameters' dtype, plus the fp32 draw of one
    tensor before its cast (`directions.unit_pieces`); fp32 parameters have no cast."""
    model = shaped(shapes, "qwen2.5-1.5b")
    params = select_parameters(model, None)
    shape = cost.ModelShape.of(model, params, [Block("all", tuple(params), 4, 0)])
    n = sum(p.numel() for p in params.values())
    embedding = 151_936 * 1536  # the largest tensor (tied head)
    assert shape.tangent_bytes(3) == 3 * (2 * n + 4 * embedding)
    fp32 = cost.ModelShape(**{**vars(shape), "element_size": 4})
    assert fp32.tangent_bytes(3) == 3 * 4 * n


@pytest.mark.parametrize("card", CARDS)
def test_statistics_pass_plans_and_head_product(card) -> None:
    """The statistics rows (Qwen2.5-1.5B, 1 × 8,192; Qwen3-8B, 8 × 32,768, both V = 151,936):
    logits 4,096 tokens at a time and batches of 32,768 tokens on either card, the head
    multiplied in bf16 with fp32 sums on CUDA (fp32 on the CPU)."""
    for free in CARDS[card]:
        for width in (1536, 4096):
            assert stats_layout(151_936, width, "cuda", free) == (MAX_STATS_CHUNK, MAX_BATCH_TOKENS)
    assert head_product_dtype("cuda", torch.bfloat16) == torch.bfloat16
    assert head_product_dtype("cuda", torch.float32) == torch.float32
    assert head_product_dtype("cpu", torch.bfloat16) == torch.float32
