"""Projected per-token scores: against one-token-at-a-time autograd, the explicit Kronecker sketch,
the projections' statistics, seeding and padding (the full-mode engines: test_full_engines.py)."""

from __future__ import annotations

import math

import pytest
import torch
from numerics import assert_close_to_norm
from tiny import soft_capped_gemma2
from torch import Tensor, nn
from transformers import GPT2Config, GPT2LMHeadModel

from otb_diag.errors import InputError
from otb_diag.maths.response_batch import ResponseBatch, pad
from otb_diag.policy.forward_pass import pad_batch, response_token_stats
from otb_diag.policy.scores import reverse_mode as scores_reverse
from otb_diag.policy.scores.directions import projection_columns
from otb_diag.policy.scores.token_scores import (
    head_sketch_matrices,
    kronecker_split,
    token_scores,
)

V = 13
PROMPTS = [[1, 2, 3], [4], [5, 6]]
RESPONSES = [[7, 8, 9, 10], [11, 12], [0, 3, 5, 7, 9, 11]]  # T = 6: rows 0 and 1 are padded


def tiny_gpt2(seed: int = 0, tied: bool = False, bias: bool = False) -> nn.Module:
    torch.manual_seed(seed)
    config = GPT2Config(
        vocab_size=V, n_embd=8, n_layer=1, n_head=2, n_positions=16, tie_word_embeddings=tied
    )
    model = GPT2LMHeadModel(config)
    if bias:  # GPT-2's head has none; a biased head exercises the folded-in bias column
        model.lm_head = nn.Linear(config.n_embd, V, bias=True)
    return model.eval()


def tiny_gemma2(seed: int = 0) -> nn.Module:
    """Untied, with a final logit soft-cap tight enough to matter."""
    return soft_capped_gemma2(V, seed)


def make_batch(temperature: list[float] | None = None) -> ResponseBatch:
    """A `ResponseBatch` of PROMPTS / RESPONSES (only the fields the scores read matter)."""
    n = len(RESPONSES)
    length = torch.tensor([len(r) for r in RESPONSES])
    width = int(length.max())
    valid = torch.arange(width)[None] < length[:, None]
    zeros = torch.zeros(n, width)
    return ResponseBatch(
        group_names=["g"], group=torch.zeros(n, dtype=torch.long), sample=torch.arange(n),
        length=length, prompt_ids=PROMPTS, response_ids=pad(RESPONSES, width, 0, torch.long),
        valid=valid, mask=valid.float(), token_rewards=zeros, reward=torch.zeros(n),
        temperature=torch.tensor(temperature or [1.0] * n), step=[None] * n, is_weights=None,
        logprobs=None, sum_pi2=None,
    )  # fmt: skip


def one_token_grads(model: nn.Module, batch: ResponseBatch, params: list[Tensor]):
    """`{(i, t): flat gradient of log p_t}` by a separate forward and backward per token."""
    grads = {}
    for i, (prompt, response) in enumerate(zip(PROMPTS, RESPONSES, strict=True)):
        ids = torch.tensor([prompt + response])
        tau = float(batch.temperature[i])
        for t, y in enumerate(response):
            logits = model(input_ids=ids, use_cache=False).logits[0, len(prompt) + t - 1]
            logp = torch.log_softmax(logits / tau, -1)[y]
            grads[i, t] = torch.cat([g.flatten() for g in torch.autograd.grad(logp, params)])
    return grads


@pytest.mark.usefixtures("torch_threads")
@pytest.mark.parametrize("tied", [False, True])
@pytest.mark.parametrize("temperature", [[1.0, 1.0, 1.0], [0.7, 1.3, 1.0]])
@pytest.mark.parametrize("pending_bytes", [None, 1])
def test_full_matches_one_token_autograd(
    tied: bool, temperature: list[float], pending_bytes: int | None, monkeypatch
) -> None:
    if pending_bytes is not None:  # project every ≥ 4 pending rows: products straddle responses
        monkeypatch.setattr(scores_reverse, "PENDING_BYTES", pending_bytes)
    model, batch, k = tiny_gpt2(tied=tied), make_batch(temperature), 32
    named = dict(model.named_parameters())  # tied tensors once
    params = list(named.values())
    # chunk_size 4 splits the longest response into two vectorised backward passes.
    out = token_scores(model, batch, "full", k, seed=3, chunk_size=4, engine="vjp")
    r = torch.cat(
        [projection_columns(3, range(k), n, p.numel(), k, "cpu") for n, p in named.items()]
    )
    for (i, t), g in one_token_grads(model, batch, params).items():
        # float32 gradients: errors judged against the size of what is compared (numerics.py).
        assert_close_to_norm(out.sq_norm[i, t], g.square().sum(), rel=1e-4, msg="‖s‖²")
        assert_close_to_norm(out.proj[i, t], g @ r, rel=1e-4, msg=f"proj {i},{t}")
    assert (out.proj[~batch.valid] == 0).all() and (out.sq_norm[~batch.valid] == 0).all()
    assert (out.sq_norm[batch.valid] > 0).all()


def biased_gpt2() -> nn.Module:
    return tiny_gpt2(bias=True)


@pytest.mark.usefixtures("torch_threads")
@pytest.mark.parametrize("build", [tiny_gpt2, biased_gpt2, tiny_gemma2])
def test_head_matches_output_layer_autograd_and_explicit_kronecker(build) -> None:
    model, batch, k = build(), make_batch([0.7, 1.0, 1.5]), 12  # k = 4 × 3
    head = model.get_output_embeddings()
    params = [head.weight] + ([head.bias] if head.bias is not None else [])
    out = token_scores(model, batch, "head", k, seed=5, chunk_size=3)
    p1, p2 = head_sketch_matrices(V, head.weight.shape[1] + len(params) - 1, k, seed=5)
    kron = torch.kron(p1.T, p2.T)  # P₁ ⊗ P₂, [k, V · (d + 1 if biased)]
    for (i, t), g in one_token_grads(model, batch, params).items():
        assert_close_to_norm(out.sq_norm[i, t], g.square().sum(), rel=1e-4, msg="‖s‖²")
        # Materialised (e_y − π) h̃ᵀ / τ, bias as the last column, row-major: vec(u h̃ᵀ).
        weight_grad = g[: head.weight.numel()].view_as(head.weight)
        if len(params) == 2:
            weight_grad = torch.cat([weight_grad, g[head.weight.numel() :, None]], dim=1)
        assert_close_to_norm(out.proj[i, t], kron @ weight_grad.flatten(), rel=1e-4, msg="proj")
    assert (out.proj[~batch.valid] == 0).all() and (out.sq_norm[~batch.valid] == 0).all()


@pytest.mark.usefixtures("torch_threads")
def test_head_norm_is_w_times_h_sq() -> None:
    """Agrees with token_stats' `w · ‖h‖²` (theory.md §2) for an untied, bias-free head."""
    model, batch = tiny_gpt2(), make_batch([0.8, 1.2, 1.0])
    out = token_scores(model, batch, "head", 16, seed=0)
    ids, attention, start = pad_batch(PROMPTS, RESPONSES)
    stats = response_token_stats(model, ids, attention, start, batch.temperature)
    assert_close_to_norm(out.sq_norm, stats.w * stats.h_sq, rel=1e-5, msg="head ‖s‖²")


@pytest.mark.parametrize("mode", ["head", "full"])
def test_seeding_and_progress(mode: str) -> None:
    model, batch = tiny_gpt2(), make_batch()
    seen: list[int] = []
    a = token_scores(model, batch, mode, 16, seed=1, progress=seen.append)
    again = token_scores(model, batch, mode, 16, seed=1)
    assert torch.equal(a.proj, again.proj) and torch.equal(a.sq_norm, again.sq_norm)
    # Another batching draws the same matrices; only the forward's rounding may differ.
    b = token_scores(model, batch, mode, 16, seed=1, batch_tokens=8, chunk_size=2)
    torch.testing.assert_close(a.proj, b.proj)
    c = token_scores(model, batch, mode, 16, seed=2)
    assert not torch.allclose(a.proj[batch.valid], c.proj[batch.valid])
    torch.testing.assert_close(a.sq_norm, c.sq_norm)  # the exact norms do not depend on the seed
    assert sum(seen) == sum(len(r) for r in RESPONSES)
    assert (a.mode, a.k, a.seed, tuple(a.proj.shape)) == (mode, 16, 1, (3, 6, 16))


# Over S seeds, ⟨Sx, Sy⟩ has mean ⟨x, y⟩ and a standard deviation σ given below; the tests ask
# the sample mean to lie within 4 σ/√S of ⟨x, y⟩ and the sample std within 25% of σ (its own
# relative error is about √(κ − 1)/(2√S) ≈ 6-9% here for the excess kurtosis κ of a product).
N_SEEDS = 400


def spread_check(samples: Tensor, mean: float, sigma: float) -> None:
    assert abs(samples.mean().item() - mean) < 4 * sigma / math.sqrt(len(samples))
    assert samples.std().item() == pytest.approx(sigma, rel=0.25)


@pytest.mark.parametrize("k", [16, 64])
def test_gaussian_jl_preserves_inner_products(k: int) -> None:
    """Gaussian JL: Var⟨Rᵀx, Rᵀy⟩ = (‖x‖²‖y‖² + ⟨x, y⟩²)/k, so the spread shrinks like 1/√k."""
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(300, generator=gen)
    y = 0.5 * x + torch.randn(300, generator=gen)
    r = torch.stack([projection_columns(s, range(k), "x", 300, k, "cpu") for s in range(N_SEEDS)])
    inner = ((x @ r) * (y @ r)).sum(-1)  # [S]
    xy = (x @ y).item()
    sigma = math.sqrt(((x @ x) * (y @ y) + xy**2).item() / k)
    spread_check(inner, xy, sigma)


@pytest.mark.parametrize("k", [16, 64])
def test_kronecker_sketch_preserves_inner_products(k: int) -> None:
    """For rank-one scores x = u ⊗ h, y = u' ⊗ h': ⟨Px, Py⟩ = X·Y with X = ⟨P₁u, P₁u'⟩ and
    Y = ⟨P₂h, P₂h'⟩ independent Gaussian-JL estimates (dimensions k₁, k₂), so its variance is
    (a² + v₁)(b² + v₂) − a²b², a = ⟨u, u'⟩, v₁ = (‖u‖²‖u'‖² + a²)/k₁ (and b, v₂ likewise)."""
    gen = torch.Generator().manual_seed(1)
    u, h = torch.randn(2, 40, generator=gen), torch.randn(2, 20, generator=gen)
    u[1] += u[0]
    h[1] += h[0]
    pairs = [head_sketch_matrices(40, 20, k, s) for s in range(N_SEEDS)]
    p1, p2 = torch.stack([p for p, _ in pairs]), torch.stack([p for _, p in pairs])
    px = (u @ p1)[..., :, None] * (h @ p2)[..., None, :]  # [S, 2, k₁, k₂]: (P₁u) ⊗ (P₂h)
    inner = (px[:, 0] * px[:, 1]).sum((-2, -1))  # [S]
    k1, k2 = kronecker_split(k)
    a, b = (u[0] @ u[1]).item(), (h[0] @ h[1]).item()
    v1 = ((u[0] @ u[0]) * (u[1] @ u[1]) + a**2).item() / k1
    v2 = ((h[0] @ h[0]) * (h[1] @ h[1]) + b**2).item() / k2
    sigma = math.sqrt((a**2 + v1) * (b**2 + v2) - a**2 * b**2)
    spread_check(inner, a * b, sigma)


@pytest.mark.parametrize(
    ("k", "split"), [(256, (16, 16)), (128, (16, 8)), (12, (4, 3)), (7, (7, 1))]
)
def test_kronecker_split(k: int, split: tuple[int, int]) -> None:
    assert kronecker_split(k) == split


@pytest.mark.parametrize(("mode", "k", "seed"), [("exact", 8, 0), ("head", 0, 0), ("full", 8, -1)])
def test_bad_arguments(mode: str, k: int, seed: int) -> None:
    with pytest.raises(InputError):
        token_scores(tiny_gpt2(), make_batch(), mode, k, seed)  # type: ignore[arg-type]


def test_proxy_scores_have_the_proxy_norm_and_no_signal() -> None:
    from otb_diag.policy.scores.token_scores import proxy_scores

    w = torch.rand(64, 50, generator=torch.Generator().manual_seed(0)) * 2
    s = proxy_scores(w, k=256, seed=3)
    assert s.shape == (64, 50, 256)
    sq = s.square().sum(-1)
    # ‖s_t‖² = w_t · χ²_k / k: relative std √(2/k) ≈ 0.088 per token; over 3200 tokens the mean
    # ratio is within a few 0.088/√3200 ≈ 0.0016 of 1
    assert (sq / w).mean().item() == pytest.approx(1.0, abs=0.01)
    assert s.mean().abs().item() < 0.01  # E s = 0
    assert torch.equal(s, proxy_scores(w, k=256, seed=3))
    assert not torch.equal(s, proxy_scores(w, k=256, seed=4))
    assert torch.equal(proxy_scores(torch.zeros(2, 3), 8, 0), torch.zeros(2, 3, 8))
