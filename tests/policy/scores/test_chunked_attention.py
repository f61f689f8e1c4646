"""The query-chunked eager attention of the forward-mode pass computes what each model's own eager
attention does, in its outputs and in its forward-mode tangents: left and right padding, GQA,
Gemma-2's attention soft-cap and sliding windows, several chunk sizes; and it really skips the
keys a causal mask excludes."""

from __future__ import annotations

import pytest
import torch
from numerics import assert_close_to_norm
from test_full_engines import falcon, gpt2, gpt_neox, llama, mistral
from torch import nn
from torch.func import functional_call, jvp, vmap
from transformers import Gemma2Config, Gemma2ForCausalLM, MistralConfig, MistralForCausalLM

from otb_diag.policy.scores import chunked_attention
from otb_diag.policy.scores.chunked_attention import NAME, chunked_attention_forward
from otb_diag.policy.scores.forward_mode import attention_implementation, forward_mode_attention

V = 13


def gemma2_softcap_window() -> nn.Module:
    """Two layers (sliding window of 3, then global), GQA 4:2, a tight attention soft-cap."""
    torch.manual_seed(5)
    config = Gemma2Config(
        vocab_size=V, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=4, sliding_window=3,
        attn_logit_softcapping=0.7, query_pre_attn_scalar=9, tie_word_embeddings=False,
    )  # fmt: skip
    return Gemma2ForCausalLM(config).eval()


def mistral_window() -> nn.Module:
    torch.manual_seed(6)
    config = MistralConfig(vocab_size=V, hidden_size=16, intermediate_size=32,
                           num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                           sliding_window=3)  # fmt: skip
    return MistralForCausalLM(config).eval()


BUILDS = [gpt2, llama, mistral, gpt_neox, gemma2_softcap_window, mistral_window]


def padded(side: str) -> tuple[torch.Tensor, torch.Tensor]:
    """`ids [3, 9]`, `attention [3, 9]`: rows of 9, 5 and 2 tokens padded on `side`."""
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(1, V, (3, 9), generator=gen)
    attention = torch.zeros(3, 9, dtype=torch.long)
    for row, n in enumerate((9, 5, 2)):
        attention[row, slice(9 - n, None) if side == "left" else slice(n)] = 1
    return ids, attention


def hidden_and_tangents(model: nn.Module, ids, attention) -> tuple[torch.Tensor, torch.Tensor]:
    """Final hidden states `[B, L, d]` and their jvp along 2 seeded parameter tangents
    `[2, B, L, d]` (vmapped, as the forward-mode engine runs)."""
    params = dict(model.named_parameters())
    gen = torch.Generator().manual_seed(1)
    tangents = {n: torch.randn(2, *p.shape, generator=gen) for n, p in params.items()}

    def hidden(p: dict) -> torch.Tensor:
        out = functional_call(model.base_model, _base(p, model), (ids,), {
            "attention_mask": attention, "use_cache": False})  # fmt: skip
        return out[0]

    with torch.no_grad():
        primal = hidden(params)
        tangent = vmap(lambda t: jvp(hidden, (params,), (t,))[1])(tangents)
    return primal, tangent


def _base(params: dict, model: nn.Module) -> dict:
    """`params` renamed for `model.base_model` (its prefix dropped; the head left out)."""
    prefix = model.base_model_prefix + "."
    return {n[len(prefix) :]: p for n, p in params.items() if n.startswith(prefix)}


@pytest.mark.parametrize("rows", [1, 4, None])
@pytest.mark.parametrize("side", ["left", "right"])
@pytest.mark.parametrize("build", BUILDS)
def test_chunked_attention_is_the_models_eager_attention(build, side: str, rows, monkeypatch):
    model = build()
    ids, attention = padded(side)
    with attention_implementation(model, "eager"):
        eager, eager_t = hidden_and_tangents(model, ids, attention)
    if rows is not None:
        heads = model.config.num_attention_heads
        monkeypatch.setattr(chunked_attention, "SCORES_PER_CHUNK", rows * 3 * heads * 9)
    with forward_mode_attention(model):
        assert model.config._attn_implementation == NAME
        chunked, chunked_t = hidden_and_tangents(model, ids, attention)
    keep = attention.bool()  # padding positions' states are never read
    msg = f"{build.__name__} {side} rows={rows}"
    assert_close_to_norm(chunked[keep], eager[keep], rel=1e-5, msg=msg)
    assert_close_to_norm(chunked_t[:, keep], eager_t[:, keep], rel=1e-5, msg=msg + " tangent")
    assert model.config._attn_implementation != NAME  # restored


def test_causal_chunks_skip_the_keys_after_their_last_row(monkeypatch) -> None:
    """With a causal mask, query rows [lo, hi) read keys [0, hi) only: the scores formed add up
    to the lower triangle by blocks, not L × L."""
    seen = []
    real = chunked_attention._chunk_keys
    monkeypatch.setattr(
        chunked_attention, "_chunk_keys", lambda *a: seen.extend(real(*a)) or real(*a)
    )
    q, k = torch.randn(2, 4, 8, 3), torch.randn(2, 2, 8, 3)
    causal = (
        torch.full((8, 8), torch.finfo(torch.float32).min).triu(1)[None, None].expand(2, 1, 8, 8)
    )
    out, _ = chunked_attention_forward(nn.Module().eval(), q, k, k, causal, rows=3)
    assert seen == [(0, 3), (0, 6), (0, 8)]
    # the same as one unchunked block over all keys (repeat_kv for GQA, fp32 softmax)
    kv = k.repeat_interleave(2, dim=1)
    full = torch.softmax(q @ kv.transpose(-1, -2) * 3**-0.5 + causal, dim=-1) @ kv
    assert_close_to_norm(out, full.transpose(1, 2), rel=1e-6)


@pytest.mark.parametrize("rows", [1, 2, 3, 5, 9])
def test_kept_keys_of_every_chunk_read_at_once_match_each_chunk_read_alone(rows) -> None:
    """Causal with a sliding window of 3, right padding of 2 in one row and a per-head mask: each
    chunk's `[first, last)` is the span of keys some row of it keeps (all keys for a chunk that
    keeps none: the padding-only rows of a batch of one padded row)."""
    low = torch.finfo(torch.float32).min
    i = torch.arange(8)
    allowed = (i[None] <= i[:, None]) & (i[:, None] - i[None] < 3)  # [Lq, Lk]
    masks = torch.where(allowed, 0.0, low)[None, None, None].repeat(2, 1, 2, 1, 1)
    masks[1, :, 1] = low  # row 1, head group 1: nothing kept
    padded = masks[:1].clone()
    padded[..., 6:, :] = low  # query rows 6, 7: padding, keep nothing
    for m in (masks, padded):
        got = chunked_attention.kept_keys(m, 8, 8, rows)
        want = []
        for lo in range(0, 8, rows):
            kept = (m[..., lo : lo + rows, :] > low / 2).flatten(0, -2).any(0).nonzero()[:, 0]
            want.append((int(kept[0]), int(kept[-1]) + 1) if len(kept) else (0, 8))
        assert got == want
    assert chunked_attention.kept_keys(None, 8, 6, rows) == [(0, 6)] * -(-8 // rows)


def test_a_planned_chunk_of_scores_sets_the_query_rows(monkeypatch) -> None:
    """Rows per chunk are ⌊scores / (B · heads · keys)⌋: `SCORES_PER_CHUNK` outside a plan, the
    planned number inside `scores_per_chunk`, and back after it."""
    seen = []
    real = chunked_attention._chunk_keys
    monkeypatch.setattr(
        chunked_attention, "_chunk_keys", lambda *a: seen.extend(real(*a)) or real(*a)
    )
    monkeypatch.setattr(chunked_attention, "SCORES_PER_CHUNK", 2 * 4 * 8 * 4)  # 4 rows
    q, k = torch.randn(2, 4, 8, 3), torch.randn(2, 2, 8, 3)
    causal = (
        torch.full((8, 8), torch.finfo(torch.float32).min).triu(1)[None, None].expand(2, 1, 8, 8)
    )
    module = nn.Module().eval()
    default, _ = chunked_attention_forward(module, q, k, k, causal)
    assert seen == [(0, 4), (0, 8)]
    seen.clear()
    with chunked_attention.scores_per_chunk(2 * 4 * 8 * 2 + 5):  # 2 rows (the 5 left over)
        planned, _ = chunked_attention_forward(module, q, k, k, causal)
    assert seen == [(0, 2), (0, 4), (0, 6), (0, 8)]
    assert_close_to_norm(planned, default, rel=1e-6)
    seen.clear()
    chunked_attention_forward(module, q, k, k, causal)
    assert seen == [(0, 4), (0, 8)]


def test_models_without_the_attention_interface_run_eager() -> None:
    """Falcon's attention does not go through the interface: the pass runs it eager (its SDPA
    has no forward-AD formula) through the config it reads, and restores it."""
    model = falcon()
    with forward_mode_attention(model):
        assert model.config._attn_implementation == "eager"
    assert model.config._attn_implementation == "sdpa"
