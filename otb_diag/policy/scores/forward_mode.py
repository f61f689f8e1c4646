"""The forward-mode `full` engine: projected per-token scores by Jacobian-vector products
(docs/theory.md §4).

For a direction `v` in parameter space, one `jvp` of the per-token log-probs of a padded batch
of responses gives `u_t(v) = ⟨v, ∇θ log p_t⟩` for every token t of the batch at once. With the
directions `v_{b,j}` of `directions.py` (zero outside block b, `N(0, 1/k_b)` inside) the k
coordinates are `u_t = P s_t`, the same projection the reverse engine computes, at the cost of k
forward-mode passes independent of T and with no stored activations. A direction confined to a
block only carries a tangent from the block on, so late blocks cost less than a full pass.

Several directions share one primal computation: `vmap` over a batch of tangents. The per-token
log-softmax runs in fp32 from the final hidden states through the output layer in chunks of
tokens (never `[B, L, V]`), the tangents in the parameters' dtype (bf16 models: bf16 tangents,
fp32 log-softmax and accumulation). `scaled_dot_product_attention` has no forward-AD formula,
so the pass switches the model to the query-chunked eager attention of `chunked_attention.py`
(eager attention for a model that cannot switch) and back. A low-precision `nn.LayerNorm` runs
as its formula during the pass (`composite_layer_norms`): CUDA's fused layer norm gave a bf16
GPT-2 body an fp32 tangent that the next bf16 product refused.

Autograd's convention for an `nn.Embedding` with a `padding_idx` (Gemma's 0, OPT's 1): its
lookup gives that row no gradient. Forward mode follows it by zeroing the row's tangent, exact
for untied embeddings; for an embedding tied to the output layer the row also feeds the logits,
so it is left alone and the engines differ only where the padding token is itself an input
(unpadded rows never contain it unless the prompt does).

`‖s_t‖²` is not available in forward mode: `‖u_t‖²` (per block, `‖u_{t,b}‖²`) is its unbiased
JL estimate, `E‖u_t‖² = ‖s_t‖²`, with relative error about `√(2/k)` per token.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator, Sequence

import torch
from torch import Tensor, nn
from torch.func import functional_call, jvp, vmap

from otb_diag.maths.response_batch import ResponseBatch
from otb_diag.policy.causal_lm import causal_lm
from otb_diag.policy.forward_pass import (
    eval_mode,
    final_hidden,
    head_logits,
    head_product_dtype,
    head_weight,
    output_layer,
    pack_by_tokens,
    pad_batch,
)
from otb_diag.policy.placement import host_batch, to_device
from otb_diag.policy.scores import chunked_attention
from otb_diag.policy.scores.directions import Block, unit_pieces

_PREFIX = "lm."  # parameter names inside `_TokenLogProbs`
# Tokens whose fp32 logits `[chunk, V]` exist at once when nothing larger is planned
# (`cost.py:plan_full` sizes it from the free memory with `runtime/memory.py:rows_that_fit`).
HEAD_CHUNK = 256
# fp32 `[chunk, V]` buffers of one head chunk (`TargetLogProb`): logits, log-softmax, `r`.
HEAD_BUFFERS = 3


class TargetLogProb(torch.autograd.Function):
    """`log p(y) = log_softmax(c·tanh((U (s·h) + b)/c) / τ)[y]` per token, `[n]` fp32, with its
    forward-mode derivative in closed form.

    With `z = c·tanh(a/c)`, `a = U (s·h) + b`, `π = softmax(z/τ)`, the slope `s_z = ∂z/∂a =
    1 − (z/c)²` (1 without a softcap) and `r = (s_z,y e_y − π ∘ s_z)/τ ∈ R^V` per token:

        d log p(y) = ⟨r, da⟩ = s·⟨dh, r U⟩ + s·⟨h, r dU⟩ + ⟨r, db⟩

    so a tangent never forms `[directions, n, V]` logits: `r U` (`[n, d]`) is shared by every
    direction and only a direction that moves `U` pays one `[n, V] × [V, d]` product, where
    autograd's jvp would pay two products and a tangent log-softmax per direction.

    The logits are `forward_pass.head_logits`' (fp32, whatever the weight's dtype). The tangent
    products run in the weight's dtype: fp32 for an fp32 weight (the CPU's plan for every model,
    `forward_pass.head_product_dtype`), or, for a half-precision weight on CUDA, `r` rounded to
    it (a relative 2⁻⁹ for bf16) and multiplied on the tensor cores with fp32 sums: in fp32
    those `[n, V] × [V, d]` products, one per direction of a tied or trained head, had run off
    the tensor cores (about 1.4 bare forwards a direction at T = 2,048 on Qwen2.5-1.5B, issue 48).
    """

    generate_vmap_rule = True

    @staticmethod
    def forward(
        h: Tensor, weight: Tensor, bias: Tensor | None, targets: Tensor, tau: Tensor,
        softcap: float | None, scale: float,
    ) -> tuple[Tensor, Tensor]:  # fmt: skip
        """`h [n, d]`, `weight [V, d]`, `bias [V]` fp32 (or wider), or a half weight and `h` in
        its dtype; `targets`, `tau [n]` → `(log p(y) [n], r [n, V])`, fp32 (or wider)."""
        if _half(weight):  # fp32 logits of the half product (`head_logits`)
            z = head_logits(h, head_weight(weight), bias, softcap, scale)  # c·tanh(a/c)
        else:  # s·h folded into h by the caller (scale 1)
            a = h @ weight.T if bias is None else torch.addmm(bias, h, weight.T)  # [n, V]
            z = a if softcap is None else a.div_(softcap).tanh_().mul_(softcap)  # c·tanh(a/c)
        logp = torch.log_softmax(z / tau[:, None], dim=-1)  # [n, V]
        picked = targets[:, None]
        logp_y = logp.gather(-1, picked)[:, 0]
        r = logp.exp_().neg_()  # −π, in the log-softmax's buffer
        if softcap is not None:
            r.mul_(1 - (z / softcap).square())  # −π ∘ s_z
            slope_y = 1 - (z.gather(-1, picked) / softcap).square()
        else:
            slope_y = torch.ones_like(picked, dtype=r.dtype)
        r.scatter_add_(-1, picked, slope_y).div_(tau[:, None])  # (s_z,y e_y − π ∘ s_z)/τ
        return logp_y, r

    @staticmethod
    def setup_context(ctx, inputs, output) -> None:  # noqa: ANN001 (autograd.Function API)
        h, weight, scale = inputs[0], inputs[1], inputs[6]
        ctx.mark_non_differentiable(output[1])
        ctx.save_for_forward(h, weight, output[1])
        ctx.scale = scale

    @staticmethod
    def jvp(ctx, dh, dweight, dbias, *_) -> tuple[Tensor, None]:  # noqa: ANN001
        h, weight, r = ctx.saved_tensors
        if not _half(weight):
            du = torch.zeros(h.shape[0], dtype=h.dtype, device=h.device)
            if dh is not None:
                du = du + (dh * (r @ weight)).sum(-1)  # ⟨dh, r U⟩
            if dweight is not None:
                du = du + (h * (r @ dweight)).sum(-1)  # ⟨h, r dU⟩
            if dbias is not None:
                du = du + r @ dbias  # ⟨r, db⟩
            return du, None
        r_w, s = r.to(weight.dtype), ctx.scale  # the products in the half weight's dtype
        du = torch.zeros(h.shape[0], dtype=r.dtype, device=h.device)
        if dh is not None:
            du = du + s * (dh.float() * (r_w @ weight).float()).sum(-1)  # s·⟨dh, r U⟩
        if dweight is not None:
            du = du + s * (h.float() * (r_w @ dweight).float()).sum(-1)  # s·⟨h, r dU⟩
        if dbias is not None:
            du = du + r @ dbias.float()  # ⟨r, db⟩
        return du, None


def _half(weight: Tensor) -> bool:
    return weight.dtype in (torch.bfloat16, torch.float16)


class _TokenLogProbs(nn.Module):
    """`forward(ids, attention, rows, pos, targets, tau) -> [N]` fp32 tempered log p of the
    tokens `ids[rows, pos]`, predicted from the final hidden states at `pos − 1`; the head's
    tangent products in `head_dtype` (`TargetLogProb`)."""

    def __init__(self, model: nn.Module, chunk_size: int, head_dtype: torch.dtype) -> None:
        super().__init__()
        self.lm, self.chunk_size, self.head_dtype = model, chunk_size, head_dtype

    def forward(
        self, ids: Tensor, attention: Tensor, rows: Tensor, pos: Tensor, tau: Tensor
    ) -> Tensor:
        hidden = final_hidden(self.lm, ids, attention)[rows, pos - 1]  # [N, d]
        weight, bias, scale, softcap = output_layer(self.lm)
        if self.head_dtype == weight.dtype and _half(weight):
            hidden = hidden.to(weight.dtype)  # the half product's inputs (`head_logits`)
        else:  # cast once per pass, not per chunk (a no-op in fp32); s·h in fp32: [N, d]
            weight, bias = weight.float(), None if bias is None else bias.float()
            hidden, scale = hidden.float() * scale, 1.0
        targets = ids[rows, pos]
        out = []
        for lo in range(0, len(rows), self.chunk_size):
            c = slice(lo, lo + self.chunk_size)
            logp = TargetLogProb.apply(hidden[c], weight, bias, targets[c], tau[c], softcap, scale)
            out.append(logp[0])
        return torch.cat(out)


@contextlib.contextmanager
def attention_implementation(model: nn.Module, name: str) -> Iterator[None]:
    """Run `model` with the attention implementation `name` (`"eager"`, `chunked_attention.NAME`),
    restoring the previous one afterwards."""
    config = model.config
    before = getattr(config, "_attn_implementation", None)
    if before in (None, name):
        yield
        return
    setter = getattr(model, "set_attn_implementation", None)
    if not switchable(model):
        setter = None  # its attention modules read the config at each call
    if setter is not None:
        setter(name)
    else:
        config._attn_implementation = name
    try:
        yield
    finally:
        if setter is not None:
            setter(before)
        else:
            config._attn_implementation = before


def eager_attention(model: nn.Module) -> contextlib.AbstractContextManager[None]:
    """Run `model` with the eager attention implementation (forward-AD has no formula for
    `scaled_dot_product_attention`)."""
    return attention_implementation(model, "eager")


def forward_mode_attention(
    model: nn.Module, name: str = chunked_attention.NAME
) -> contextlib.AbstractContextManager[None]:
    """Run `model` with `name` (default: the query-chunked eager attention), or with eager
    attention for a model whose attention does not go through transformers' `AttentionInterface`
    (it cannot switch to a registered implementation: Falcon, custom code)."""
    return attention_implementation(model, name if switchable(model) else "eager")


def switchable(model: nn.Module) -> bool:
    """Whether `model`'s attention goes through transformers' `AttentionInterface`."""
    return getattr(type(model), "_can_set_attn_implementation", lambda: False)()


@contextlib.contextmanager
def composite_layer_norms(model: nn.Module) -> Iterator[None]:
    """Run every `nn.LayerNorm` of `model` whose weight is not fp32 as its formula
    (`_layer_norm_formula`), restoring its own forward afterwards.

    Why: on an H100 (torch 2.11, CUDA), forward mode through a bf16 GPT-2 body stopped at the
    first product after `ln_1` with "expected mat1 and mat2 to have the same dtype, but got:
    float != BFloat16", where the CPU ran: the fused kernel's jvp leaves the tangent in fp32. The
    formula's tangent follows its primal's dtype. fp32 norms keep the fused kernel (same numbers
    as before, bit for bit). A module that accelerate wrapped (`_old_forward`) has that replaced,
    so its device hooks still run."""
    patched = []
    for module in model.modules():
        if isinstance(module, nn.LayerNorm) and module.weight is not None:
            if module.weight.dtype == torch.float32:
                continue
            name = "_old_forward" if hasattr(module, "_old_forward") else "forward"
            patched.append((module, name, module.__dict__.get(name)))
            setattr(module, name, _layer_norm_formula.__get__(module))
    try:
        yield
    finally:
        for module, name, before in patched:
            if before is None:
                delattr(module, name)  # back to the class's forward
            else:
                setattr(module, name, before)


def _layer_norm_formula(self: nn.LayerNorm, x: Tensor) -> Tensor:
    """`(x − μ) / √(σ² + ε) · γ + β` over the normalized dims, in fp32 at least, cast back to x's
    dtype (what the fused kernel computes; σ² is the biased variance, as in `F.layer_norm`)."""
    dims = tuple(range(-len(self.normalized_shape), 0))
    wide = torch.promote_types(x.dtype, torch.float32)
    x_wide = x.to(wide)
    centred = x_wide - x_wide.mean(dims, keepdim=True)
    y = centred * torch.rsqrt(centred.square().mean(dims, keepdim=True) + self.eps)
    y = y * self.weight.to(wide)
    if self.bias is not None:
        y = y + self.bias.to(wide)
    return y.to(x.dtype)


def forward_scores(
    model: nn.Module,
    batch: ResponseBatch,
    params: dict[str, Tensor],
    blocks: Sequence[Block],
    seed: int,
    *,
    batch_tokens: int,
    directions_batch: int,
    chunk_size: int = HEAD_CHUNK,
    progress: Callable[[int], None] | None = None,
    attention: str = chunked_attention.NAME,
    attention_scores: int | None = None,
    head_dtype: torch.dtype | None = None,
) -> Tensor:
    """`proj [B, T, K]` (K = Σ_b k_b) fp32 on the CPU, 0 at padding: `proj[i, t, offset_b + j] =
    ⟨v_{b,j}, ∇θ log p_t⟩` (module docstring).

    Responses are packed into padded batches of at most `batch_tokens` `prompt ⧺ response`
    tokens; each batch runs `⌈k_b / directions_batch⌉` vmapped jvps per block, every one over
    `directions_batch` tangents; the head's logits are formed `chunk_size` tokens at a time.
    `progress` gets the response tokens of a batch once all its directions are queued. The model
    runs with the `attention` implementation (`forward_mode_attention`), whose query chunks hold
    `attention_scores` scores (default: `chunked_attention.SCORES_PER_CHUNK`). The head's tangent
    products run in `head_dtype` (default: `forward_pass.head_product_dtype` of the output layer
    on its device: fp32 on the CPU, a half model's own dtype on CUDA; `TargetLogProb`). A PEFT
    wrapper runs as its causal LM (`causal_lm`), whose names `params` uses.
    """
    model = causal_lm(model)
    batch = host_batch(batch)  # its rows read on the host (any device given)
    device = next(iter(params.values())).device
    n_rows, width = batch.response_ids.shape
    # Filled on the device and copied off once: a copy per vmapped call made the host wait for
    # each call before drawing the next one's tangents, where it can run ahead of the GPU.
    proj = torch.zeros(n_rows, width, sum(b.k for b in blocks), device=device)
    lengths = batch.length.tolist()
    weight = output_layer(model)[0]
    head_dtype = head_dtype or head_product_dtype(weight.device.type, weight.dtype)
    wrapper = _TokenLogProbs(model, chunk_size, head_dtype)
    frozen = _padding_rows(model)
    packed = [len(p) + n for p, n in zip(batch.prompt_ids, lengths, strict=True)]
    planned = chunked_attention.scores_per_chunk(
        attention_scores or chunked_attention.SCORES_PER_CHUNK
    )
    with (
        torch.no_grad(),
        eval_mode(model),
        forward_mode_attention(model, attention),
        composite_layer_norms(model),
        planned,
    ):
        for group in pack_by_tokens(packed, batch_tokens):
            inputs, out_rows, cols = _padded(batch, group, device)
            out_rows, cols = to_device(out_rows, device), to_device(cols, device)
            for block in blocks:
                primals = {_PREFIX + n: params[n] for n in block.params}

                for lo in range(0, block.k, directions_batch):
                    js = range(lo, min(lo + directions_batch, block.k))
                    tangents = {
                        _PREFIX + n: unit_pieces(seed, js, n, params[n].shape, device).to(
                            params[n].dtype
                        )
                        for n in block.params
                    }  # {name: [d, *shape]}: √k_b · v_{b,j} restricted to each parameter
                    for n, row in frozen.items():
                        if _PREFIX + n in tangents:
                            tangents[_PREFIX + n][:, row] = 0  # autograd's padding convention
                    u = vmap(_jvp_fn(wrapper, inputs, primals))(
                        tangents
                    )  # [d, N]: √k_b·⟨v, ∇θ log p_t⟩
                    proj[out_rows, cols, block.offset + lo : block.offset + lo + len(js)] = (
                        u.T.float() / math.sqrt(block.k)
                    )  # the jvp is linear in the tangent: 1/√k_b applied to [N, d], not to [d, D]
            if progress is not None:
                progress(sum(lengths[i] for i in group))
    return proj.cpu()


def _padding_rows(model: nn.Module) -> dict[str, int]:
    """`{weight name: padding_idx}` of the `nn.Embedding`s with a padding row that are not tied
    to the output layer (module docstring)."""
    head = model.get_output_embeddings()
    return {
        f"{prefix}.weight": module.padding_idx
        for prefix, module in model.named_modules()
        if isinstance(module, nn.Embedding)
        and module.padding_idx is not None
        and (head is None or module.weight is not head.weight)
    }


def _jvp_fn(
    wrapper: nn.Module, inputs: tuple[Tensor, ...], primals: dict[str, Tensor]
) -> Callable[[dict[str, Tensor]], Tensor]:
    """`tangents -> [N]`: the per-token directional derivatives `⟨v, ∇θ log p_t⟩`."""

    def logprobs(p: dict[str, Tensor]) -> Tensor:
        return functional_call(wrapper, p, inputs)

    def directional(tangents: dict[str, Tensor]) -> Tensor:
        return jvp(logprobs, (primals,), (tangents,))[1]

    return directional


def _padded(
    batch: ResponseBatch, group: list[int], device: torch.device
) -> tuple[tuple[Tensor, ...], Tensor, Tensor]:
    """The `_TokenLogProbs` inputs of the rows `group` (right-padded), and where each of the N
    valid tokens goes in the `[B, T]` grid (`out_rows`, `cols`)."""
    n_tok = batch.length[group]
    responses = [
        batch.response_ids[i, : int(n)].tolist() for i, n in zip(group, n_tok, strict=True)
    ]
    ids, attention, start = pad_batch([batch.prompt_ids[i] for i in group], responses)
    rows, cols = (torch.arange(int(n_tok.max()))[None] < n_tok[:, None]).nonzero(as_tuple=True)
    pos = start[rows] + cols  # position of y_{t+1}; the hidden state at pos − 1 predicts it
    tau = batch.temperature[group][rows]
    inputs = tuple(to_device(x, device) for x in (ids, attention, rows, pos, tau))  # no wait
    return inputs, torch.tensor(group)[rows], cols
