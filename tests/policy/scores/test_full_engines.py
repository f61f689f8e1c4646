"""The two `full`-mode engines: forward mode (jvp) and reverse mode (vjp) give the same
projections on the same seeded directions, across architectures, blocks, parameter selections
and bf16; the directions regenerate; the cost model refuses and accepts as documented."""

from __future__ import annotations

import math
import warnings

import pytest
import torch
from numerics import assert_close_to_norm
from test_token_scores import V, make_batch, one_token_grads, tiny_gemma2
from torch import nn
from transformers import (
    FalconConfig,
    FalconForCausalLM,
    GPT2Config,
    GPT2LMHeadModel,
    GPTNeoXConfig,
    GPTNeoXForCausalLM,
    LlamaConfig,
    LlamaForCausalLM,
    MistralConfig,
    MistralForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
)

from otb_diag.errors import InputError
from otb_diag.policy.scores.chunked_attention import NAME
from otb_diag.policy.scores.directions import (
    Block,
    block_of,
    parameter_blocks,
    projection_columns,
    select_parameters,
    unit_pieces,
)
from otb_diag.policy.scores.forward_mode import (
    TargetLogProb,
    composite_layer_norms,
    forward_scores,
)
from otb_diag.policy.scores.token_scores import token_scores

SMALL = {"vocab_size": V, "hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 2,
         "num_attention_heads": 2}  # fmt: skip


def gpt2(layers: int = 2) -> nn.Module:
    torch.manual_seed(0)
    config = GPT2Config(vocab_size=V, n_embd=16, n_layer=layers, n_head=2, n_positions=16,
                        tie_word_embeddings=False)  # fmt: skip
    return GPT2LMHeadModel(config).eval()


def llama() -> nn.Module:
    torch.manual_seed(1)
    return LlamaForCausalLM(LlamaConfig(**SMALL, num_key_value_heads=1)).eval()


def qwen2() -> nn.Module:
    torch.manual_seed(2)
    return Qwen2ForCausalLM(Qwen2Config(**SMALL, num_key_value_heads=1)).eval()


def mistral() -> nn.Module:
    torch.manual_seed(3)
    return MistralForCausalLM(MistralConfig(**SMALL, num_key_value_heads=1)).eval()


def falcon() -> nn.Module:
    """Its attention does not go through transformers' `AttentionInterface` (eager, not chunked)."""
    torch.manual_seed(7)
    return FalconForCausalLM(FalconConfig(vocab_size=V, hidden_size=16, num_hidden_layers=2,
                                          num_attention_heads=2)).eval()  # fmt: skip


def gpt_neox() -> nn.Module:
    torch.manual_seed(4)
    return GPTNeoXForCausalLM(GPTNeoXConfig(**SMALL, max_position_embeddings=32)).eval()


def both(model: nn.Module, batch, k: int = 8, **kwargs):
    """(vjp, jvp) scores of the same directions."""
    vjp = token_scores(model, batch, "full", k, seed=3, engine="vjp", chunk_size=4, **kwargs)
    jvp = token_scores(model, batch, "full", k, seed=3, engine="jvp", **kwargs)
    return vjp, jvp


# OPT is left out: on its tied input embedding the engines differ by ~1 % of the projection
# (forward mode agrees with float64 finite differences, reverse mode with autograd); an open
# question reported with issue 10, not hidden by a tolerance.
@pytest.mark.parametrize("build", [gpt2, llama, qwen2, mistral, gpt_neox, tiny_gemma2, falcon])
def test_engines_agree_across_architectures(build) -> None:
    model, batch = build(), make_batch([0.7, 1.3, 1.0])
    vjp, jvp = both(model, batch)
    assert (vjp.engine, jvp.engine, vjp.sq_norm_exact, jvp.sq_norm_exact) == (
        "vjp", "jvp", True, False
    )  # fmt: skip
    assert_close_to_norm(jvp.proj, vjp.proj, rel=1e-5, msg=build.__name__)
    assert (jvp.proj[~batch.valid] == 0).all()
    # the model is left as it was: its attention implementation restored, no gradients kept
    assert model.config._attn_implementation not in ("eager", NAME) or build is tiny_gemma2
    assert all(p.grad is None for p in model.parameters())


@pytest.mark.parametrize("by_block", [False, True])
def test_reverse_engine_is_the_explicit_projection_of_autograd_gradients(by_block: bool) -> None:
    """vjp's u_t = P s_t with P's rows rebuilt from `projection_columns`, and exact norms."""
    model, batch = gpt2(), make_batch([1.0, 0.8, 1.2])
    params = select_parameters(model, None)
    blocks = parameter_blocks(model, list(params), by_block=by_block, k=8)
    out = token_scores(model, batch, "full", 8, seed=3, engine="vjp", by_block=by_block)
    cols = torch.cat([  # [n_params, K], block-diagonal
        torch.cat([projection_columns(3, range(b.k), n, p.numel(), b.k, "cpu")
                   if n in b.params else torch.zeros(p.numel(), b.k) for b in blocks], dim=1)
        for n, p in params.items()
    ])  # fmt: skip
    for (i, t), g in one_token_grads(model, batch, list(model.parameters())).items():
        assert_close_to_norm(out.proj[i, t], g @ cols, rel=1e-5)
        torch.testing.assert_close(out.sq_norm[i, t], g.square().sum(), rtol=1e-4, atol=0)
    assert out.blocks == tuple((b.name, b.offset, b.k) for b in blocks)
    torch.testing.assert_close(out.block_sq_norm.sum(-1), out.sq_norm)


def test_engines_agree_on_the_embedded_default() -> None:
    from otb_diag.io.batches import checkpoint_batch
    from otb_diag.io.loading import LoadOptions, load_rollouts
    from otb_diag.io.scenarios import DEFAULT_ROLLOUTS, default_checkpoint
    from otb_diag.policy.scores.cost import _sub_batch

    ckpt, batch, _ = checkpoint_batch(
        default_checkpoint(), load_rollouts(DEFAULT_ROLLOUTS), LoadOptions()
    )
    sub = _sub_batch(batch, [0, 1, 40, 100, 200, 300], 20)
    vjp, jvp = both(ckpt.model, sub, k=6, by_block=True, directions_per_block=1)
    assert [name for name, _, _ in vjp.blocks] == [
        "embeddings", "layer.0", "layer.1", "layer.2", "final_norm", "head"
    ]  # fmt: skip
    assert_close_to_norm(jvp.proj, vjp.proj, rel=1e-5)


def direction_piece(seed: int, j: int, name: str, shape: tuple[int, ...], k: int) -> torch.Tensor:
    """The piece of direction `v_j` on parameter `name` (CPU): entries `N(0, 1/k)`."""
    return unit_pieces(seed, [j], name, shape, "cpu")[0] / math.sqrt(k)


def test_directions_regenerate_identically_and_independently() -> None:
    a = direction_piece(7, 3, "model.layers.0.mlp.up_proj.weight", (5, 4), 16)
    again = direction_piece(7, 3, "model.layers.0.mlp.up_proj.weight", (5, 4), 16)
    assert torch.equal(a, again)
    name = "model.layers.0.mlp.up_proj.weight"
    for other in [(8, 3, name), (7, 4, name), (7, 3, name.replace("0", "1"))]:
        assert not torch.allclose(a, direction_piece(*other, (5, 4), 16))
    # the scale is 1/√k: over many entries, the variance is 1/k
    big = direction_piece(0, 0, "w", (200_000,), 16)
    assert big.var().item() == pytest.approx(1 / 16, rel=0.02)
    # the reverse engine's columns are the same pieces
    cols = projection_columns(7, range(2, 5), "x", 20, 16, "cpu")
    torch.testing.assert_close(cols[:, 1], direction_piece(7, 3, "x", (20,), 16))


def test_forward_engine_does_not_depend_on_batching() -> None:
    model, batch = gpt2(), make_batch()
    a = token_scores(model, batch, "full", 8, seed=1, engine="jvp")
    b = token_scores(model, batch, "full", 8, seed=1, engine="jvp", batch_tokens=8)
    assert_close_to_norm(b.proj, a.proj, rel=1e-5)
    c = token_scores(model, batch, "full", 8, seed=2, engine="jvp")
    assert not torch.allclose(a.proj[batch.valid], c.proj[batch.valid])


def test_blocks_of_common_architectures() -> None:
    head = frozenset({"lm_head.weight", "embed_out.weight"})
    cases = {
        "transformer.wte.weight": "embeddings", "transformer.wpe.weight": "embeddings",
        "transformer.h.11.attn.c_attn.weight": "layer.11", "transformer.ln_f.bias": "final_norm",
        "model.embed_tokens.weight": "embeddings",
        "model.layers.3.self_attn.q_proj.weight": "layer.3",
        "model.norm.weight": "final_norm", "lm_head.weight": "head", "embed_out.weight": "head",
        "gpt_neox.layers.0.mlp.dense_h_to_4h.bias": "layer.0",
        "gpt_neox.final_layer_norm.weight": "final_norm",
        "model.decoder.layers.1.fc1.weight": "layer.1",
        "model.decoder.embed_positions.weight": "embeddings",
        "model.layers.2.self_attn.q_proj.lora_A.default.weight": "layer.2",
    }  # fmt: skip
    assert {name: block_of(name, head) for name in cases} == cases
    model = gpt_neox()
    blocks = parameter_blocks(model, [n for n, _ in model.named_parameters()], by_block=True, k=10)
    assert [b.name for b in blocks] == ["embeddings", "layer.0", "layer.1", "final_norm", "head"]
    assert [b.k for b in blocks] == [2] * 5 and [b.offset for b in blocks] == [0, 2, 4, 6, 8]


def test_params_regex_selects_the_head_exactly() -> None:
    """Full mode on the head alone gives the head's exact norms, `w · ‖h‖²` (head mode)."""
    model, batch = gpt2(), make_batch([0.8, 1.2, 1.0])
    out = token_scores(model, batch, "full", 8, seed=0, engine="vjp", params=r"^lm_head\.")
    head = token_scores(model, batch, "head", 16, seed=0)
    torch.testing.assert_close(out.sq_norm, head.sq_norm, rtol=1e-4, atol=1e-7)
    with pytest.raises(InputError, match="matches none"):
        token_scores(model, batch, "full", 8, seed=0, params="no_such_parameter")
    with pytest.raises(InputError, match="regular expression"):
        token_scores(model, batch, "full", 8, seed=0, params="(")


def test_bf16_forward_mode_tracks_fp32() -> None:
    """bf16 weights, bf16 tangents, fp32 log-softmax: within bf16 rounding of the fp32 run on
    the same (bf16-rounded) weights; reverse mode runs on bf16 too."""
    model16 = gpt2().to(torch.bfloat16)
    model32 = gpt2().to(torch.bfloat16).float()
    batch = make_batch()
    a = token_scores(model16, batch, "full", 8, seed=0, engine="jvp")
    b = token_scores(model32, batch, "full", 8, seed=0, engine="jvp")
    assert a.proj.dtype == torch.float32
    assert_close_to_norm(a.proj, b.proj, rel=5e-2)
    r = token_scores(model16, batch, "full", 8, seed=0, engine="vjp")
    assert_close_to_norm(r.proj, b.proj, rel=5e-2)


@pytest.mark.parametrize("shape", [(5, 16), (3, 4, 6)])
def test_composite_layer_norm_is_the_fused_kernel(shape) -> None:
    """The formula a bf16 `nn.LayerNorm` runs as in forward mode equals `F.layer_norm` (float64
    weights and inputs, over one and two normalized dims, with and without a bias), and its
    tangent under `torch.func.jvp` is the fused kernel's and keeps a bf16 input's dtype."""
    torch.manual_seed(0)
    normalized = shape[1:]
    for bias in (True, False):
        norm = nn.LayerNorm(normalized, eps=1e-5, bias=bias).double()
        with torch.no_grad():
            norm.weight.normal_()
            if bias:
                norm.bias.normal_()
        x, dx = torch.randn(shape, dtype=torch.float64), torch.randn(shape, dtype=torch.float64)
        fused = torch.func.jvp(norm, (x,), (dx,))
        with composite_layer_norms(norm):  # any norm but an fp32 one is replaced
            assert "forward" in vars(norm)
            composite = torch.func.jvp(norm, (x,), (dx,))
        assert "forward" not in vars(norm)  # the class's forward again
        for got, want in zip(composite, fused, strict=True):
            assert_close_to_norm(got, want, rel=1e-12)
    norm16 = nn.LayerNorm(normalized).to(torch.bfloat16)
    x16 = torch.randn(shape, dtype=torch.bfloat16)
    with composite_layer_norms(norm16):
        out, tangent = torch.func.jvp(norm16, (x16,), (torch.randn_like(x16),))
    assert out.dtype == tangent.dtype == torch.bfloat16


def test_composite_layer_norms_leave_fp32_and_restore_a_wrapped_forward() -> None:
    """fp32 norms keep the fused kernel; a norm whose forward was already replaced (accelerate's
    device hooks keep the original in `_old_forward`) gets that back afterwards."""
    model = gpt2()
    with composite_layer_norms(model):
        assert not any("forward" in vars(m) for m in model.modules() if isinstance(m, nn.LayerNorm))
    norm = nn.LayerNorm(4).to(torch.bfloat16)
    original = norm.forward
    norm._old_forward = original
    with composite_layer_norms(norm):
        assert norm._old_forward is not original
    assert norm._old_forward is original


@pytest.mark.slow  # averaged over many seeds
def test_jvp_norms_are_the_unbiased_jl_estimate() -> None:
    model, batch = gpt2(), make_batch()
    vjp, jvp = both(model, batch, k=8)
    torch.testing.assert_close(jvp.sq_norm, jvp.proj.square().sum(-1))
    # averaged over many seeds, ‖u_t‖² comes to the exact ‖s_t‖² (relative std √(2/k) each)
    runs = torch.stack(
        [token_scores(model, batch, "full", 8, seed=s, engine="jvp").sq_norm for s in range(60)]
    )
    ratio = runs.mean(0)[batch.valid] / vjp.sq_norm[batch.valid]
    assert ratio.mean().item() == pytest.approx(1.0, abs=4 * math.sqrt(2 / 8 / 60))


@pytest.mark.parametrize("softcap", [None, 3.0])
@pytest.mark.parametrize("biased", [False, True])
def test_closed_form_head_jvp_is_autograds(softcap: float | None, biased: bool) -> None:
    """The output layer's closed-form tangent (`TargetLogProb`) against torch.func's own jvp of
    the plain formula, in float64, vmapped over directions as the engine runs it; per-token
    temperatures and a softcap included."""
    gen = torch.Generator().manual_seed(0)
    n, d, vocab, dirs = 5, 6, 11, 3
    h, weight = torch.randn(n, d, generator=gen).double(), torch.randn(vocab, d, generator=gen)
    weight = weight.double()
    bias = torch.randn(vocab, generator=gen).double() if biased else None
    targets, tau = torch.randint(0, vocab, (n,), generator=gen), torch.tensor([0.7, 1, 1.3, 2, 1])
    tau = tau.double()
    tangents = [torch.randn(dirs, *x.shape, generator=gen).double() for x in (h, weight)]
    if biased:
        tangents.append(torch.randn(dirs, vocab, generator=gen).double())

    def plain(h, w, b=None):
        z = h @ w.T + (0 if b is None else b)
        z = z if softcap is None else softcap * torch.tanh(z / softcap)
        return torch.log_softmax(z / tau[:, None], -1).gather(-1, targets[:, None])[:, 0]

    def closed(h, w, b=None):
        return TargetLogProb.apply(h, w, b, targets, tau, softcap, 1.0)[0]

    primals = (h, weight, bias) if biased else (h, weight)
    for f in (plain, closed):
        assert_close_to_norm(f(*primals), plain(*primals), rel=1e-12, msg="log p")
    expected = torch.func.vmap(lambda *t: torch.func.jvp(plain, primals, t)[1])(*tangents)
    actual = torch.func.vmap(lambda *t: torch.func.jvp(closed, primals, t)[1])(*tangents)
    assert_close_to_norm(actual, expected, rel=1e-12, msg="tangent")
    # a direction that leaves the head alone: only the hidden state's tangent
    only_h = torch.func.jvp(lambda x: closed(x, *primals[1:]), (h,), (tangents[0][0],))[1]
    expected_h = torch.func.jvp(lambda x: plain(x, *primals[1:]), (h,), (tangents[0][0],))[1]
    assert_close_to_norm(only_h, expected_h, rel=1e-12, msg="hidden only")


@pytest.mark.parametrize("tied", [False, True])
def test_half_precision_head_tangents_against_fp32(tied: bool) -> None:
    """A bf16 model's head tangent products in bf16 (`r` rounded to it: what CUDA runs, on its
    tensor cores, `forward_pass.head_product_dtype`) against the same products in fp32 (what the
    CPU runs): within 1e-2 of the projections' norm (2e-3 measured on GPT-2, Qwen2 and Granite
    shapes, a logit scale included), far inside the JL error `√(2/k)`; the CPU's default is
    fp32, bit for bit."""
    torch.manual_seed(4)
    config = GPT2Config(vocab_size=V, n_embd=16, n_layer=2, n_head=2, n_positions=16,
                        tie_word_embeddings=tied)  # fmt: skip
    model = GPT2LMHeadModel(config).eval().to(torch.bfloat16)
    batch = make_batch([0.7, 1.3, 1.0])
    params = select_parameters(model, None)
    blocks = [Block("all", tuple(params), 16, 0)]

    def run(head_dtype: torch.dtype | None) -> torch.Tensor:
        return forward_scores(model, batch, params, blocks, 0, batch_tokens=1024,
                              directions_batch=4, head_dtype=head_dtype)  # fmt: skip

    half, full = run(torch.bfloat16), run(torch.float32)
    assert not torch.equal(half, full)  # the half path ran
    assert_close_to_norm(half, full, rel=1e-2, msg="bf16 head tangents")
    assert torch.equal(run(None), full)


def test_the_cuda_head_path_runs_under_vmap_and_jvp_on_the_meta_device() -> None:
    """The meta device has CUDA's `mm(..., out_dtype=float32)` (`forward_pass._half_into_fp32`):
    the half head's primal product and its bf16 tangent products, vmapped over directions as the
    engine runs them, give fp32 `[directions, n]` without a batching rule missing (vmap's
    fallback warns, here an error)."""
    n, d, vocab, dirs = 5, 8, 11, 3
    bf16 = dict(dtype=torch.bfloat16, device="meta")
    h, w = torch.empty(n, d, **bf16), torch.empty(vocab, d, **bf16)
    targets, tau = torch.zeros(n, dtype=torch.long, device="meta"), torch.ones(n, device="meta")
    tangents = torch.empty(dirs, n, d, **bf16), torch.empty(dirs, vocab, d, **bf16)

    def logp(h, w):
        return TargetLogProb.apply(h, w, None, targets, tau, None, 0.5)[0]

    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        du = torch.func.vmap(lambda a, b: torch.func.jvp(logp, (h, w), (a, b))[1])(*tangents)
    assert du.shape == (dirs, n) and du.dtype == torch.float32
