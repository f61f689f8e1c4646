"""Per-token score vectors `s_t = ∇_θ log π(y_t | x, y_<t)` projected to k dimensions
(docs/theory.md §4).

The empirical policy-gradient variance needs, for every response token, a k-dimensional random
projection `S s_t` of its score vector and `‖s_t‖²`. A projection `S` with `E[Sᵀ S] = I`
preserves inner products in expectation, `E[(S x)·(S y)] = x·y`, so sums of projected scores
estimate the squared norms and inner products that the variance is made of.

Two modes, both under the tempered policy `π_t = softmax(z_t / τ)`:

- `head`: the exact gradient of the output layer alone, from a forward pass. For `z = U h + b`,
  `∂ log p_t / ∂U = u_t h_tᵀ` and `∂ log p_t / ∂b = u_t`, with `u_t = (e_{y_t} − π_t) / τ` (the
  gradient with respect to the raw logits; times `1 − (z/c)²` under a soft-cap `c · tanh(·/c)`).
  The bias is folded in as an extra input column, `[U | b]` against `h̃ = [h; 1]`, so the score
  is the rank-one `u h̃ᵀ` and the Kronecker sketch `(P₁ ⊗ P₂) vec(u h̃ᵀ) = (P₁ u) ⊗ (P₂ h̃)` needs
  neither `V × d` per token nor `[B, T, V]`: only `[chunk, V]` logits at a time.
  `‖s_t‖² = ‖u_t‖² ‖h̃_t‖²`.
- `full`: the gradient of every selected parameter (all by default), projected on the seeded
  directions of `directions.py` (Gaussian JL, block-diagonal when split into blocks), by one of
  two engines that give the same projections: `vjp` (`reverse_mode.py`: per-token gradients,
  exact `‖s_t‖²`) or `jvp` (`forward_mode.py`: one forward-mode pass per direction for all
  tokens at once; `‖s_t‖²` estimated by `‖u_t‖²`, unbiased). `cost.py` estimates both,
  picks one (`engine="auto"`) and refuses what exceeds the budget or the memory.

The head and proxy matrices are drawn on the CPU from generators seeded by `(seed, stream)`, so
equal seeds give the same matrices on every device and for every batching.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import torch
from torch import Tensor, nn

from otb_diag.errors import InputError
from otb_diag.maths.response_batch import ResponseBatch
from otb_diag.policy.causal_lm import causal_lm
from otb_diag.policy.forward_pass import (
    BATCH_TOKENS,
    STATS_CHUNK,
    check_output_layer,
    eval_mode,
    final_hidden,
    head_logits,
    head_weight,
    output_layer,
    pack_by_tokens,
    pad_batch,
)
from otb_diag.policy.placement import host_batch, to_device
from otb_diag.policy.scores.cost import DEFAULT_BUDGET_S, FullPlan, plan_full
from otb_diag.policy.scores.directions import parameter_blocks, select_parameters
from otb_diag.policy.scores.forward_mode import forward_scores
from otb_diag.policy.scores.reverse_mode import reverse_scores

# Tokens per chunk when the caller does not say (see `token_scores`); also the valid modes.
_DEFAULT_CHUNK = {"head": STATS_CHUNK, "full": 32}

# Generator streams, so that no two random matrices share numbers (2: `directions.py`).
_STREAM_VOCAB, _STREAM_HIDDEN, _STREAM_PROXY = 0, 1, 3


@dataclass(frozen=True)
class TokenScores:
    """Projected per-token scores of a `ResponseBatch` (`B` responses, `T` = longest), on the CPU.

    proj: `[B, T, k]` fp32, the projection of `s_t`; 0 at padding (`t ≥ T_i`).
    sq_norm: `[B, T]` fp32, `‖s_t‖²` (exact, or its JL estimate `‖u_t‖²` when not
    `sq_norm_exact`: the `jvp` engine); 0 at padding.
    blocks: `(name, first coordinate, k_b)` of each parameter block (`full`; one block `all`
    unless split); block_sq_norm: `[B, T, n_blocks]` fp32, `‖s_{t,b}‖²` per block (`full`).
    Tool-output tokens (`mask` 0) get their scores too: applying `mask` is the estimator's job.
    """

    proj: Tensor
    sq_norm: Tensor
    mode: str
    k: int
    seed: int
    engine: str = "forward"
    sq_norm_exact: bool = True
    blocks: tuple[tuple[str, int, int], ...] = ()
    block_sq_norm: Tensor | None = None
    plan: dict[str, Any] = field(default_factory=dict)


def token_scores(
    model: nn.Module,
    batch: ResponseBatch,
    mode: Literal["head", "full"],
    k: int,
    seed: int,
    *,
    chunk_size: int | None = None,
    batch_tokens: int = BATCH_TOKENS,
    force: bool = False,
    progress: Callable[[int], None] | None = None,
    engine: Literal["auto", "jvp", "vjp"] = "auto",
    params: str | None = None,
    by_block: bool = False,
    directions_per_block: int | None = None,
    budget_s: float | None = DEFAULT_BUDGET_S,
    on_plan: Callable[[FullPlan], None] | None = None,
) -> TokenScores:
    """Projected score vectors of every response token of `batch` under `model`.

    model: a Hugging Face causal LM (`*ForCausalLM`), run in eval mode (dropout off); a PEFT
    wrapper runs as the causal LM inside it (`causal_lm`: its adapter active).
    mode: `head` (output layer, Kronecker sketch, any model size) or `full` (the selected
    parameters, Gaussian JL directions, any model that fits in memory and the budget).
    k: projection dimension; `head` splits it as `k₁ × k₂` (see `kronecker_split`); `full` with
    `by_block` gives each block `directions_per_block` (default `⌈k / blocks⌉`) directions.
    seed: a non-negative integer; equal seeds give identical projections.
    chunk_size: tokens handled at once: their `[chunk, V]` logits (`head`, default 256; the
    `jvp` engine's head too) or the `vjp` engine's per-token gradients `[chunk, n_params]`
    (default 32, lowered to fit memory: each chunk's backward passes run over the prefix it
    needs, so small chunks skip most of the causal triangle's unused half).
    batch_tokens: padded `prompt ⧺ response` tokens per forward pass (`head`, `jvp`; the `jvp`
    engine takes at most `cost.CPU_FORWARD_BATCH_TOKENS` on the CPU).
    force: run `full` mode even when its estimate exceeds `budget_s` (seconds; None: no limit).
    progress: called with the number of response tokens of each finished batch or response.
    engine, params, by_block, directions_per_block: `full` only: the engine (`auto` by the cost
    model), a regular expression selecting parameters by name, and the block split.
    on_plan: called with the cost estimate before a `full` run starts.
    The batch's tensors may be on any device (read on the host: `placement.host_batch`).
    """
    model = causal_lm(model)
    batch = host_batch(batch)
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
        return TokenScores(proj, sq_norm, mode, k, seed, engine="forward")
    if directions_per_block is not None and directions_per_block < 1:
        raise InputError("directions per block must be at least 1", field="directions-per-block")
    selected = select_parameters(model, params)
    blocks = parameter_blocks(
        model, list(selected), by_block=by_block, k=k, directions_per_block=directions_per_block
    )
    plan = plan_full(
        model, batch, selected, blocks, seed, engine=engine, budget_s=budget_s, force=force,
        batch_tokens=batch_tokens, chunk_size=chunk_size,
    )  # fmt: skip
    if on_plan is not None:
        on_plan(plan)
    if plan.engine == "vjp":
        proj, block_sq = reverse_scores(
            model, batch, selected, blocks, seed, plan.reverse_chunk, progress
        )
    else:
        proj = forward_scores(
            model, batch, selected, blocks, seed, batch_tokens=plan.forward_batch_tokens,
            directions_batch=plan.directions_batch, chunk_size=plan.head_chunk, progress=progress,
            attention_scores=plan.attention_scores,
        )  # fmt: skip
        # E‖u_{t,b}‖² = ‖s_{t,b}‖²: the unbiased JL estimate of each block's norm
        block_sq = torch.stack(
            [proj[..., b.offset : b.offset + b.k].square().sum(-1) for b in blocks], dim=-1
        )
    return TokenScores(
        proj, block_sq.sum(-1), mode, proj.shape[-1], seed, engine=plan.engine,
        sq_norm_exact=plan.engine == "vjp", blocks=tuple((b.name, b.offset, b.k) for b in blocks),
        block_sq_norm=block_sq, plan=plan.as_dict(),
    )  # fmt: skip


def proxy_scores(w: Tensor, k: int, seed: int) -> Tensor:
    """Synthetic score vectors for the forward-only `proxy` mode: `s_t = √w_t · ξ_t` with
    independent `ξ_t ~ N(0, I_k / k)`, `[B, T] -> [B, T, k]`.

    They encode exactly the proxy's assumption (docs/theory.md §2, §4): per-token scores are
    uncorrelated, with `E‖s_t‖² = w_t` and no signal (`E s_t = 0`). Under them the variance of
    `ĝ = Σ c A s` is `E Σ_t c² A² w` in expectation: the token-level total power, measured by the
    same paired-draw machinery as the exact modes, so the modes can be compared line by line.
    """
    xi = _gaussian(w.numel(), k, seed, _STREAM_PROXY).view(*w.shape, k)  # entries N(0, 1/k)
    xi = xi.to(w.device)  # drawn on the CPU (the same numbers on every device), used on w's
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


def _gaussian(rows: int, cols: int, seed: int, *stream: int) -> Tensor:
    """`[rows, cols]` fp32 with entries `N(0, 1/cols)` from the generator of `(seed, *stream)`."""
    # SeedSequence mixes the key into well-spread state, so nearby seeds give unrelated streams.
    state = np.random.SeedSequence([seed, *stream]).generate_state(1, np.uint64)[0]
    generator = torch.Generator().manual_seed(int(state))
    return torch.randn(rows, cols, generator=generator) / math.sqrt(cols)


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


@dataclass(frozen=True)
class HeadSketch:
    """The output layer and the Kronecker factors of head mode, on the layer's device.

    weight: `[V, d]` as `forward_pass.py:head_weight` gives it, bias `[V]` or None, scale s and
    softcap c as `forward_pass.py:output_layer` reads them; p1 `[V, k₁]`, p2 `[d (+1), k₂]` from
    `head_sketch_matrices`. Built once, it scores any number of tokens (`head_sketch`)."""

    weight: Tensor
    bias: Tensor | None
    scale: float
    softcap: float | None
    p1: Tensor
    p2: Tensor


def head_sketch_of(model: nn.Module, k: int, seed: int, *, check: bool = True) -> HeadSketch:
    """`model`'s output layer (with `check`, checked against its logits: `check_output_layer`,
    two forward passes of a short probe) and the sketch matrices of dimension `k` and `seed`:
    what `head_sketch_from_hidden` needs (a PEFT wrapper's causal LM's: `causal_lm`)."""
    model = causal_lm(model)
    if check:
        check_output_layer(model)
    weight, bias, scale, softcap = output_layer(model)
    p1, p2 = head_sketch_matrices(weight.shape[0], weight.shape[1] + (bias is not None), k, seed)
    bias = None if bias is None else bias.detach()
    return HeadSketch(
        head_weight(weight), bias, scale, softcap, p1.to(weight.device), p2.to(weight.device)
    )


def head_sketch(
    hidden: Tensor,
    logits: Tensor,
    targets: Tensor,
    tau: Tensor,
    sketch: tuple[Tensor, Tensor],
    biased: bool,
    softcap: float | None = None,
) -> tuple[Tensor, Tensor]:
    """The head-mode score of each token from the output layer's input and output (module
    docstring): `(P₁ u) ⊗ (P₂ h̃)` `[..., k]` and `‖u h̃ᵀ‖²_F = ‖u‖² ‖h̃‖²` `[...]`, fp32.

    hidden: `[..., d]` what the head reads (`s · h`, the final hidden state times the logit
    scale of `forward_pass.output_layer`); logits: `[..., V]` its output `z` (after the
    soft-cap, before the temperature); targets: `[...]` the sampled tokens; tau: `[...]` or a
    scalar temperature; sketch: `head_sketch_matrices(V, d + biased, k, seed)` on their device;
    biased: the head has a bias (folded in as `h̃ = [h; 1]`). `_head_scores` calls it on the
    chunks of its own forward, a verl actor on its log-prob forward (`integrations/verl/scores.py`).
    """
    z = logits.reshape(-1, logits.shape[-1]).float()
    p1, p2 = (p.to(z.device) for p in sketch)  # everything where the logits are
    lead = targets.shape
    h = hidden.reshape(-1, hidden.shape[-1]).to(z.device, torch.float32)
    tau = torch.as_tensor(tau, dtype=torch.float32).to(z.device).expand(lead).reshape(-1)
    u = _logit_score(z, targets.reshape(-1).to(z.device), tau, softcap)  # [N, V]
    if biased:
        h = torch.cat([h, torch.ones_like(h[:, :1])], dim=1)  # h̃ = [h; 1]
    proj = ((u @ p1)[:, :, None] * (h @ p2)[:, None, :]).flatten(1)  # (P₁u) ⊗ (P₂h̃)
    sq_norm = u.square().sum(-1) * h.square().sum(-1)  # ‖u h̃ᵀ‖²_F = ‖u‖² ‖h̃‖²
    return proj.reshape(*lead, -1), sq_norm.reshape(lead)


def head_sketch_from_hidden(
    sketch: HeadSketch, hidden: Tensor, targets: Tensor, tau: Tensor, chunk_size: int = STATS_CHUNK
) -> tuple[Tensor, Tensor]:
    """`proj [N, k]`, `sq_norm [N]` (CPU, fp32) of N tokens' output-layer scores (module
    docstring) from the final hidden states that predict them, `hidden [N, d]` (any dtype),
    their `targets [N]` and temperatures `tau [N]`: the head's logits recomputed
    `[chunk_size, V]` at a time, no gradient, then `head_sketch`. The tensors may come on any
    devices: they are moved to the layer's once, and the scores copied off it once."""
    proj, sq_norm = sketched_on_device(sketch, hidden, targets, tau, chunk_size)
    return proj.cpu(), sq_norm.cpu()


def sketched_on_device(
    sketch: HeadSketch, hidden: Tensor, targets: Tensor, tau: Tensor, chunk_size: int
) -> tuple[Tensor, Tensor]:
    """`head_sketch_from_hidden`'s scores, left on the layer's device (no read of the device
    per chunk: the caller copies them off once; the live split, once a step)."""
    device = sketch.weight.device
    hidden, targets = hidden.to(device), targets.to(device)
    tau = torch.as_tensor(tau, dtype=torch.float32).to(device).expand(targets.shape)
    k = sketch.p1.shape[1] * sketch.p2.shape[1]
    proj = torch.empty(len(targets), k, device=device)
    sq_norm = torch.empty(len(targets), device=device)
    biased = sketch.bias is not None
    with torch.no_grad():
        for lo in range(0, len(targets), chunk_size):
            c = slice(lo, lo + chunk_size)
            z = head_logits(hidden[c], sketch.weight, sketch.bias, sketch.softcap, sketch.scale)
            h = hidden[c].float() * sketch.scale  # the head reads s · h
            proj[c], sq_norm[c] = head_sketch(
                h, z, targets[c], tau[c], (sketch.p1, sketch.p2), biased, sketch.softcap
            )
    return proj, sq_norm


def _head_scores(
    model: nn.Module,
    batch: ResponseBatch,
    k: int,
    seed: int,
    chunk_size: int,
    batch_tokens: int,
    progress: Callable[[int], None] | None,
) -> tuple[Tensor, Tensor]:
    """`proj [B, T, k]`, `sq_norm [B, T]` of the output-layer scores (module docstring), on the
    CPU: filled on the model's device, copied off it once.

    Memory beyond the forward pass: `[chunk, V]` logits and scores, `P₁ᵀ` (`V · k₁ · 4` bytes),
    the `[B, T, k]` grid, and an fp32 copy of the output layer for half-precision models on the
    CPU (`forward_pass.head_weight`).
    """
    sketch = head_sketch_of(model, k, seed)
    device = sketch.weight.device
    proj, sq_norm = (grid.to(device) for grid in _grid(batch, k))
    lengths = batch.length.tolist()
    with torch.no_grad(), eval_mode(model):
        packed = [len(p) + n for p, n in zip(batch.prompt_ids, lengths, strict=True)]
        for group in pack_by_tokens(packed, batch_tokens):
            responses = [batch.response_ids[i, : lengths[i]].tolist() for i in group]
            ids, _, start = pad_batch([batch.prompt_ids[i] for i in group], responses)
            n_tok = torch.tensor([lengths[i] for i in group])
            rows, cols = (torch.arange(int(n_tok.max()))[None] < n_tok[:, None]).nonzero(
                as_tuple=True
            )  # the N valid (row, t) pairs, 0-based t, found on the host
            pos = start[rows] + cols  # position of y_{t+1}; the logits at pos − 1 predict it
            out_rows = torch.tensor(group)[rows]
            ids_d, rows_d, before, targets, tau, out_rows, cols = (
                to_device(x, device)
                for x in (ids, rows, pos - 1, ids[rows, pos], batch.temperature[group][rows],
                          out_rows, cols)
            )  # fmt: skip
            # A mask of ones, as the statistics pass runs it (`response_token_stats`): the rows
            # are right-padded, so causal attention never reads padding from a real token.
            hidden = final_hidden(model, ids_d, torch.ones_like(ids_d))  # [b, L, d]
            proj[out_rows, cols], sq_norm[out_rows, cols] = sketched_on_device(
                sketch, hidden[rows_d, before], targets, tau, chunk_size
            )  # hidden: [N, d]
            if progress is not None:
                progress(int(n_tok.sum()))
    return proj.cpu(), sq_norm.cpu()
