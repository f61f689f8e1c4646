"""Per-token score vectors `s_t = ∇_θ log π(y_t | x, y_<t)` projected to k dimensions (theory §4).

The empirical policy-gradient variance needs, for every response token, a k-dimensional random
projection `S s_t` of its score vector and the exact `‖s_t‖²`. A projection `S` with
`E[Sᵀ S] = I` preserves inner products in expectation, `E[(S x)·(S y)] = x·y`, so sums of
projected scores estimate the squared norms and inner products that the variance is made of.

Two modes, both under the tempered policy `π_t = softmax(z_t / τ)`:

- `head`: the exact gradient of the output layer alone, from a forward pass. For `z = U h + b`,
  `∂ log p_t / ∂U = u_t h_tᵀ` and `∂ log p_t / ∂b = u_t`, with `u_t = (e_{y_t} − π_t) / τ` (the
  gradient with respect to the raw logits; times `1 − (z/c)²` under a soft-cap `c · tanh(·/c)`).
  The bias is folded in as an extra input column, `[U | b]` against `h̃ = [h; 1]`, so the score
  is the rank-one `u h̃ᵀ` and the Kronecker sketch `(P₁ ⊗ P₂) vec(u h̃ᵀ) = (P₁ u) ⊗ (P₂ h̃)` needs
  neither `V × d` per token nor `[B, T, V]`: only `[chunk, V]` logits at a time.
  `‖s_t‖² = ‖u_t‖² ‖h̃_t‖²`.
- `full`: the exact gradient of every parameter of a small model, one response at a time and,
  within it, one chunk of tokens at a time (a forward pass over the prefix the chunk needs, then
  its backward passes vectorised over the chunk's tokens), projected by a dense
  Gaussian Johnson–Lindenstrauss matrix `R ∈ R^{n_params × k}`, `R_ij ~ N(0, 1/k)`: `Rᵀ s_t`.

Random matrices are drawn on the CPU from generators seeded by `(seed, stream)`, so equal seeds
give the same matrices on every device and for every batching (and identical numbers when the
call is repeated as is).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch
from torch import Tensor, nn
from torch.func import functional_call, vjp, vmap

from otb_diag.errors import InputError
from otb_diag.maths.response_batch import ResponseBatch
from otb_diag.maths.token_stats import (
    check_output_layer,
    eval_mode,
    final_hidden,
    head_logits,
    output_layer,
    pack_by_tokens,
    pad_batch,
)

# `full` mode costs about n_params · (6 L + 2 k) flops per token (L: the prefix length, k: the
# projection's); above this many parameters it is refused unless forced.
FULL_MODE_MAX_PARAMS = 10_000_000

# Rows of R drawn by one generator: 65 536 · k fp32 numbers (64 MiB at k = 256).
_R_BLOCK_ROWS = 1 << 16

# R is kept in memory up to this size and otherwise redrawn, block by block, for every product.
_R_HOLD_BYTES = 1 << 30

# Gradients of several responses are collected up to this size and projected in one product:
# each product reads all of R (0.6 GiB for the default at k = 256), which cost more than the
# arithmetic when every few-token response was projected on its own (61 s of 67 s, measured).
_PENDING_BYTES = 1 << 28

# Tokens per chunk when the caller does not say (see `token_scores`); also the valid modes.
_DEFAULT_CHUNK = {"head": 256, "full": 32}

# Generator streams, so that no two random matrices share numbers.
_STREAM_VOCAB, _STREAM_HIDDEN, _STREAM_FULL, _STREAM_PROXY = 0, 1, 2, 3


@dataclass(frozen=True)
class TokenScores:
    """Projected per-token scores of a `ResponseBatch` (`B` responses, `T` = longest), on the CPU.

    proj: `[B, T, k]` fp32, the projection of `s_t`; 0 at padding (`t ≥ T_i`).
    sq_norm: `[B, T]` fp32, the exact `‖s_t‖²` before projection; 0 at padding.
    Tool-output tokens (`mask` 0) get their scores too: applying `mask` is the estimator's job.
    """

    proj: Tensor
    sq_norm: Tensor
    mode: str
    k: int
    seed: int


def token_scores(
    model: nn.Module,
    batch: ResponseBatch,
    mode: Literal["head", "full"],
    k: int,
    seed: int,
    *,
    chunk_size: int | None = None,
    batch_tokens: int = 16384,
    force: bool = False,
    progress: Callable[[int], None] | None = None,
) -> TokenScores:
    """Projected score vectors of every response token of `batch` under `model`.

    model: a Hugging Face causal LM (`*ForCausalLM`), run in eval mode (dropout off).
    mode: `head` (output layer, Kronecker sketch, any model size) or `full` (all parameters,
    Gaussian JL, fp32 models of at most `FULL_MODE_MAX_PARAMS` parameters unless `force`).
    k: projection dimension; `head` splits it as `k₁ × k₂` (see `kronecker_split`).
    seed: a non-negative integer; equal seeds give identical projections.
    chunk_size: tokens handled at once: their `[chunk, V]` logits (`head`, default 256) or their
    `[chunk, n_params]` gradients (`full`, default 32: each chunk's backward passes run over the
    prefix it needs, so small chunks skip most of the causal triangle's unused half, while larger
    ones vectorise better; 32 was fastest on a 2-core CPU for 3–80-token responses).
    batch_tokens: padded `prompt ⧺ response` tokens per forward pass (`head`).
    progress: called with the number of response tokens of each finished batch or response.
    """
    if mode not in _DEFAULT_CHUNK:
        raise InputError(f"mode must be 'head' or 'full', got {mode!r}")
    if k < 1:
        raise InputError(f"the projection dimension k must be at least 1, got {k}")
    if seed < 0:
        raise InputError(f"seed must be a non-negative integer, got {seed}")
    chunk_size = _DEFAULT_CHUNK[mode] if chunk_size is None else chunk_size
    if chunk_size < 1:
        raise InputError(f"chunk_size must be at least 1, got {chunk_size}")
    if any(len(p) == 0 for p in batch.prompt_ids):
        raise InputError("every prompt needs at least one token: it predicts the first response")
    if (batch.temperature <= 0).any():
        raise InputError("temperature must be positive")
    if mode == "head":
        proj, sq_norm = _head_scores(model, batch, k, seed, chunk_size, batch_tokens, progress)
    else:
        proj, sq_norm = _full_scores(model, batch, k, seed, chunk_size, force, progress)
    return TokenScores(proj, sq_norm, mode, k, seed)


def proxy_scores(w: Tensor, k: int, seed: int) -> Tensor:
    """Synthetic score vectors for the forward-only `proxy` mode: `s_t = √w_t · ξ_t` with
    independent `ξ_t ~ N(0, I_k / k)`, `[B, T] -> [B, T, k]`.

    They encode exactly the proxy's assumption (theory.md §2, §4): per-token scores are
    uncorrelated, with `E‖s_t‖² = w_t` and no signal (`E s_t = 0`). Under them the variance of
    `ĝ = Σ c A s` is `E Σ_t c² A² w` in expectation: the token-level total power, measured by the
    same paired-draw machinery as the exact modes, so the modes can be compared line by line.
    """
    xi = _gaussian(w.numel(), k, seed, _STREAM_PROXY).view(*w.shape, k)  # entries N(0, 1/k)
    return w.clamp_min(0).sqrt().unsqueeze(-1) * xi


def kronecker_split(k: int) -> tuple[int, int]:
    """`(k₁, k₂)` with `k₁ · k₂ = k`: `k₂` the largest divisor of k not above `√k`, `k₁ ≥ k₂`.

    The relative variance of a Kronecker sketch grows like `1/k₁ + 1/k₂`, smallest for a square
    split (256 → 16 × 16, 128 → 16 × 8); a prime k degenerates to `k × 1`, so prefer `4ⁿ`.
    The vocabulary side gets the larger factor.
    """
    k2 = next(d for d in range(math.isqrt(k), 0, -1) if k % d == 0)
    return k // k2, k2


def head_sketch_matrices(vocab: int, width: int, k: int, seed: int) -> tuple[Tensor, Tensor]:
    """The Kronecker factors, transposed: `P₁ᵀ [vocab, k₁]` and `P₂ᵀ [width, k₂]`, fp32 CPU.

    Entries `N(0, 1/k₁)` and `N(0, 1/k₂)`, so `E[P₁ᵀP₁] = I`, `E[P₂ᵀP₂] = I` and, the two being
    independent, `E[(P₁ ⊗ P₂)ᵀ (P₁ ⊗ P₂)] = I`. `width` is d, or d + 1 for a biased head.
    """
    k1, k2 = kronecker_split(k)
    return _gaussian(vocab, k1, seed, _STREAM_VOCAB), _gaussian(width, k2, seed, _STREAM_HIDDEN)


def jl_matrix(n_params: int, k: int, seed: int) -> Tensor:
    """The `full`-mode projection `R [n_params, k]`, entries `N(0, 1/k)`, fp32 CPU.

    Rows follow `model.named_parameters()` order (tied tensors once), each flattened row-major.
    Memory `n_params · k · 4` bytes: 0.1 GiB for 10⁵ parameters at k = 256.
    """
    return torch.cat([_r_block(n_params, k, seed, b) for b in range(_n_blocks(n_params))])


def _gaussian(rows: int, cols: int, seed: int, *stream: int) -> Tensor:
    """`[rows, cols]` fp32 with entries `N(0, 1/cols)` from the generator of `(seed, *stream)`."""
    # SeedSequence mixes the key into well-spread state, so nearby seeds give unrelated streams.
    state = np.random.SeedSequence([seed, *stream]).generate_state(1, np.uint64)[0]
    generator = torch.Generator().manual_seed(int(state))
    return torch.randn(rows, cols, generator=generator) / math.sqrt(cols)


def _n_blocks(n_params: int) -> int:
    return -(-n_params // _R_BLOCK_ROWS)  # ⌈n / block⌉


def _r_block(n_params: int, k: int, seed: int, b: int) -> Tensor:
    """Rows `[b · block, min((b + 1) · block, n))` of R, drawable on their own."""
    rows = min(_R_BLOCK_ROWS, n_params - b * _R_BLOCK_ROWS)
    return _gaussian(rows, k, seed, _STREAM_FULL, b)


def _grid(batch: ResponseBatch, k: int) -> tuple[Tensor, Tensor]:
    """Zero `proj [B, T, k]` and `sq_norm [B, T]` to fill in."""
    n_rows, width = batch.response_ids.shape
    return torch.zeros(n_rows, width, k), torch.zeros(n_rows, width)


def _logit_score(z: Tensor, targets: Tensor, tau: Tensor, softcap: float | None) -> Tensor:
    """`u = ∂ log softmax(z/τ)_y / ∂a [N, V]`, with `a` the logits before any soft-cap.

    z: `[N, V]` fp32 logits (after the soft-cap `z = c · tanh(a/c)`, if any); targets, tau: `[N]`.
    """
    pi = torch.softmax(z / tau[:, None], dim=-1)
    y = targets[:, None]
    # u_y = 1 − p_y, summed from the other entries: no cancellation as p_y → 1.
    rest = pi.scatter(-1, y, 0.0).sum(-1, keepdim=True)
    u = pi.neg_().scatter_(-1, y, rest)  # e_y − π
    u.div_(tau[:, None])  # the raw-logit gradient carries 1/τ
    if softcap is not None:
        u.mul_(1 - (z / softcap).square())  # dz/da = 1 − tanh²(a/c) = 1 − (z/c)²
    return u


def _head_scores(
    model: nn.Module,
    batch: ResponseBatch,
    k: int,
    seed: int,
    chunk_size: int,
    batch_tokens: int,
    progress: Callable[[int], None] | None,
) -> tuple[Tensor, Tensor]:
    """`proj [B, T, k]`, `sq_norm [B, T]` of the output-layer scores (module docstring).

    Memory beyond the forward pass: `[chunk, V]` logits and scores, `P₁ᵀ` (`V · k₁ · 4` bytes) and
    an fp32 copy of the output layer for half-precision models.
    """
    check_output_layer(model)
    weight, bias, scale, softcap = output_layer(model)
    device = weight.device
    p1, p2 = head_sketch_matrices(weight.shape[0], weight.shape[1] + (bias is not None), k, seed)
    p1, p2 = p1.to(device), p2.to(device)
    proj, sq_norm = _grid(batch, k)
    lengths = batch.length.tolist()
    with torch.no_grad(), eval_mode(model):
        weight32 = weight.float()  # fp32 logit maths for half-precision models (no-op if fp32)
        packed = [len(p) + n for p, n in zip(batch.prompt_ids, lengths, strict=True)]
        for group in pack_by_tokens(packed, batch_tokens):
            responses = [batch.response_ids[i, : lengths[i]].tolist() for i in group]
            ids, attention, start = pad_batch([batch.prompt_ids[i] for i in group], responses)
            hidden = final_hidden(model, ids.to(device), attention.to(device))  # [b, L, d]
            n_tok = torch.tensor([lengths[i] for i in group])
            rows, cols = (torch.arange(int(n_tok.max()))[None] < n_tok[:, None]).nonzero(
                as_tuple=True
            )  # the N valid (row, t) pairs, 0-based t
            pos = start[rows] + cols  # position of y_{t+1}; the logits at pos − 1 predict it
            h_all = hidden[rows.to(device), (pos - 1).to(device)]  # [N, d]
            y_all = ids[rows, pos].to(device)
            tau_all = batch.temperature[group][rows].to(device)
            out_rows = torch.tensor(group)[rows]
            for lo in range(0, len(rows), chunk_size):
                c = slice(lo, lo + chunk_size)
                h = h_all[c].float() * scale  # the head reads s · h
                z = head_logits(h, weight32, bias, softcap)  # [chunk, V]
                u = _logit_score(z, y_all[c], tau_all[c], softcap)
                if bias is not None:
                    h = torch.cat([h, torch.ones_like(h[:, :1])], dim=1)  # h̃ = [h; 1]
                sketch = (u @ p1)[:, :, None] * (h @ p2)[:, None, :]  # (P₁u) ⊗ (P₂h̃)
                proj[out_rows[c], cols[c]] = sketch.flatten(1).cpu()
                # ‖u h̃ᵀ‖²_F = ‖u‖² ‖h̃‖²
                sq_norm[out_rows[c], cols[c]] = (u.square().sum(-1) * h.square().sum(-1)).cpu()
            if progress is not None:
                progress(int(n_tok.sum()))
    return proj, sq_norm


def _full_scores(
    model: nn.Module,
    batch: ResponseBatch,
    k: int,
    seed: int,
    chunk_size: int,
    force: bool,
    progress: Callable[[int], None] | None,
) -> tuple[Tensor, Tensor]:
    """`proj [B, T, k]`, `sq_norm [B, T]` of the all-parameter scores, `Rᵀ s_t` (module docstring).

    Memory: one chunk's vectorised backward pass over one response's prefix, the gradients waiting
    to be projected (at most `_PENDING_BYTES`, or one chunk if that is larger), and R
    (`n_params · k · 4` bytes) when that is at most 1 GiB; a larger R is redrawn block by block for
    every product (slow, but memory stays bounded).
    Time: about `n_params · (6 L + 2 k)` flops per token, L the prefix length; at k = 256 the
    projection costs as much as the gradients themselves.
    """
    params = {name: p.detach() for name, p in model.named_parameters()}  # tied tensors once
    n_params = sum(p.numel() for p in params.values())
    if n_params > FULL_MODE_MAX_PARAMS and not force:
        raise InputError(
            f"full mode computes every token's gradient of all {n_params:,} parameters; it is "
            f"meant for models of at most {FULL_MODE_MAX_PARAMS:,}.",
            hint="Use mode 'head' (exact output-layer scores, any model size), or force=True.",
        )
    if any(p.dtype != torch.float32 for p in params.values()):
        raise InputError("full mode needs an fp32 model", hint="Load it with dtype float32.")
    device = next(iter(params.values())).device
    n_blocks = _n_blocks(n_params)
    held = None
    if n_params * k * 4 <= _R_HOLD_BYTES:
        held = [_r_block(n_params, k, seed, b).to(device) for b in range(n_blocks)]

    def r_block(b: int) -> Tensor:
        return held[b] if held is not None else _r_block(n_params, k, seed, b).to(device)

    proj, sq_norm = _grid(batch, k)
    pending: list[tuple[int, int, Tensor]] = []  # (row, first t, gradients [c, n]) to project
    pending_rows = max(chunk_size, _PENDING_BYTES // (4 * n_params))

    def project_pending() -> None:
        g = torch.cat([grads for _, _, grads in pending])
        r_g = sum(
            g[:, b * _R_BLOCK_ROWS : (b + 1) * _R_BLOCK_ROWS] @ r_block(b) for b in range(n_blocks)
        ).cpu()  # Rᵀ s_t, block by block
        at = 0
        for i, lo, grads in pending:
            proj[i, lo : lo + len(grads)] = r_g[at : at + len(grads)]
            at += len(grads)
        pending.clear()

    with eval_mode(model), warnings.catch_warnings():
        # The vectorised backward of CPU scaled-dot-product attention falls back to a loop and
        # says so on every call; the numbers are exact, only the warning would alarm users.
        warnings.filterwarnings("ignore", message=".*performance drop.*", category=UserWarning)
        for i, n_tok in enumerate(batch.length.tolist()):
            if n_tok == 0:
                continue
            prompt = batch.prompt_ids[i]
            ids = torch.tensor(prompt + batch.response_ids[i, :n_tok].tolist(), device=device)
            tau = float(batch.temperature[i])
            for lo in range(0, n_tok, chunk_size):
                hi = min(lo + chunk_size, n_tok)
                # Causal: tokens lo … hi − 1 depend on the first P + hi − 1 positions only, so the
                # backward passes run over that prefix, not the whole row.
                prefix = ids[: len(prompt) + hi]
                logprobs = _logprob_fn(model, prefix, len(prompt) + lo, tau)
                _, pullback = vjp(logprobs, params)
                (grads,) = vmap(pullback)(torch.eye(hi - lo, device=device))  # {name: [c, ...]}
                g = torch.cat([grads[name].flatten(1) for name in params], dim=1)  # [chunk, n]
                sq_norm[i, lo:hi] = g.square().sum(-1).cpu()  # ‖∇_θ log p_t‖²
                pending.append((i, lo, g))
                if sum(len(grads) for _, _, grads in pending) >= pending_rows:
                    project_pending()
            if progress is not None:
                progress(n_tok)
        if pending:
            project_pending()
    return proj, sq_norm


def _logprob_fn(
    model: nn.Module, ids: Tensor, first: int, tau: float
) -> Callable[[dict[str, Tensor]], Tensor]:
    """`params -> [L − first]` tempered log p of the tokens `ids[first:]` of one unpadded row."""

    def logprobs(params: dict[str, Tensor]) -> Tensor:
        out = functional_call(model, params, (ids[None],), {"use_cache": False})
        z = out.logits[0, first - 1 : -1] / tau  # the logits at position j − 1 predict token j
        return torch.log_softmax(z, -1).gather(-1, ids[first:, None])[:, 0]

    return logprobs
