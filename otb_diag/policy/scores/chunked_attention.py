"""Query-chunked eager attention for the forward-mode pass (docs/theory.md §4).

`scaled_dot_product_attention` has no forward-AD formula, and the eager implementation forms the
scores `[B, heads, L, L]` at once: under `vmap(jvp)` each of them also carries a tangent per
direction, which dominates the time and memory of a forward-mode pass at long T. This is the
eager computation, `softmax(c·tanh(s q kᵀ / c) + mask) v` (c: Gemma-2's `softcap`, absent for
most models; s: `scaling`), done `rows` query rows at a time with plain differentiable ops, so
forward AD goes through it unchanged while the `L × L` intermediates and their tangents exist
only `rows × keys` at a time. Keys that the mask excludes for every row of a chunk (after its last
row for a causal mask, before its window for a sliding one) are skipped, which brings a causal
model's attention work from `L²` towards `L²/2` as the chunks get more numerous: exact, since an
excluded key's weight `exp(min − max)` is 0 in fp32.

It is registered with transformers' `AttentionInterface` under `NAME`, with the eager (additive
4-D float) mask, so a model switched to it (`set_attn_implementation(NAME)`, done by
`scores_forward.forward_mode_attention`) builds the same masks (padding, causal, sliding windows)
as for eager attention. Keys and values are shared across a GQA group by broadcasting instead of
`repeat_kv`'s copies; the softmax runs in fp32; dropout follows `module.training` as eager's does.

The scores of a chunk are `SCORES_PER_CHUNK` elements (cache-sized, the CPU's) unless a pass
plans more inside `scores_per_chunk(n)` (`cost.py:scores_chunk_for`, from a GPU's free memory).
`scaled_dot_product_attention` under the MATH backend does have a forward-AD formula, but it forms
all `L × L` scores and skips no key: 1.2-1.5× (L = 512) to 2.7-3.9× (L = 2,048) this path's time
under `vmap(jvp)` on the CPU (bench/README.md, run 6), so it is not used.
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Iterator
from contextvars import ContextVar

import torch
from torch import Tensor, nn
from torch._C._functorch import is_batchedtensor
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, eager_mask
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

NAME = "otb_chunked_eager"
SCORES_PER_CHUNK = 1 << 20  # elements of one chunk's [B, heads, rows, keys] scores (4 MiB fp32)
_PLANNED: ContextVar[int | None] = ContextVar("scores_per_chunk", default=None)


@contextlib.contextmanager
def scores_per_chunk(n: int) -> Iterator[None]:
    """Inside: chunks of `n` scores instead of `SCORES_PER_CHUNK` (a pass's memory plan)."""
    token = _PLANNED.set(n)
    try:
        yield
    finally:
        _PLANNED.reset(token)


def chunked_attention_forward(
    module: nn.Module,
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attention_mask: Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    softcap: float | None = None,
    rows: int | None = None,
    **kwargs: object,
) -> tuple[Tensor, None]:
    """`(out [B, Lq, heads, D], None)` from `query [B, heads, Lq, D]`, `key`/`value
    [B, kv_heads, Lk, D]` and the additive `attention_mask [B, 1, Lq, Lk]` (0 kept, dtype min
    dropped) or None; `rows` query rows per chunk (default: `SCORES_PER_CHUNK` scores, or the
    planned `scores_per_chunk`)."""
    batch, heads, q_len, head_dim = query.shape
    kv_heads, kv_len = key.shape[1], key.shape[2]
    group = heads // kv_heads  # GQA: query heads per key/value head
    scaling = head_dim**-0.5 if scaling is None else scaling
    budget = _PLANNED.get() or SCORES_PER_CHUNK
    rows = rows or max(1, budget // (batch * heads * kv_len))
    # s·q once per call, not s·(q kᵀ) per chunk: [B, h, L, D] instead of [B, h, L, Lk] (and a
    # chunk's operations fewer, each one a pass of forward-mode's bookkeeping on the host)
    q = (query * scaling).reshape(batch, kv_heads, group, q_len, head_dim)
    k, v = key[:, :, None], value[:, :, None]  # [B, kv_heads, 1, Lk, D]: broadcast over the group
    masks = None if attention_mask is None else _grouped(attention_mask[..., :kv_len], kv_heads)
    bounds = _chunk_keys(attention_mask, masks, q_len, kv_len, rows)  # [first, last) per chunk
    out = []
    for lo, (first, last) in zip(range(0, q_len, rows), bounds, strict=True):
        hi = min(lo + rows, q_len)
        mask = None if masks is None else masks[:, :, :, lo:hi]
        scores = q[:, :, :, lo:hi] @ k[:, :, :, first:last].transpose(-1, -2)
        if softcap is not None:
            scores = softcap * torch.tanh(scores / softcap)  # Gemma-2: c·tanh(s/c)
        if mask is not None:
            scores = scores + mask[..., first:last]
        weights = torch.softmax(scores, dim=-1, dtype=torch.float32).to(query.dtype)
        weights = nn.functional.dropout(weights, p=dropout, training=module.training)
        out.append(weights @ v[:, :, :, first:last])  # [B, kv_heads, group, rows, D]
    attended = torch.cat(out, dim=3).reshape(batch, heads, q_len, head_dim)
    return attended.transpose(1, 2).contiguous(), None


def _grouped(mask: Tensor, kv_heads: int) -> Tensor:
    """`[B, 1 or kv_heads, 1 or group, Lq, Lk]`: a `[B, 1, Lq, Lk]` mask broadcast over all heads,
    a per-head `[B, heads, Lq, Lk]` one split into its key/value groups."""
    if mask.shape[1] == 1:
        return mask[:, :, None]
    return mask.unflatten(1, (kv_heads, mask.shape[1] // kv_heads))


# The last masks whose chunks' keys were read (`_chunk_keys`), weakly: (mask, shape key, bounds).
_READ: list[tuple[weakref.ref, tuple[int, ...], list[tuple[int, int]]]] = []
_READ_KEPT = 2  # Gemma-2's layers alternate two masks (sliding window, full)


def _chunk_keys(
    attention_mask: Tensor | None, masks: Tensor | None, q_len: int, kv_len: int, rows: int
) -> list[tuple[int, int]]:
    """`kept_keys` of a call, read off the device at most once per mask: a call of one chunk
    takes every key without reading (its mask still drops what it drops: exact), and the layers
    of one forward, which share their mask, reuse the first layer's read (a read per layer had
    made a GPU's queue drain once per layer: 28 times a forward of Qwen2.5-1.5B, issue 48)."""
    n = -(-q_len // rows)
    if n == 1 or attention_mask is None or is_batchedtensor(attention_mask):
        return kept_keys(None, q_len, kv_len, rows)
    shape = (q_len, kv_len, rows, *masks.shape)
    for ref, key, bounds in _READ:
        if ref() is attention_mask and key == shape:
            return bounds
    bounds = kept_keys(masks, q_len, kv_len, rows)
    _READ[:] = [(weakref.ref(attention_mask), shape, bounds), *_READ[: _READ_KEPT - 1]]
    return bounds


def kept_keys(masks: Tensor | None, q_len: int, kv_len: int, rows: int) -> list[tuple[int, int]]:
    """`[first, last)` of each of the `⌈Lq / rows⌉` chunks of `rows` query rows: the keys some row
    of the chunk attends to under `masks [..., Lq, Lk]` (additive; all `Lk` keys when it is
    absent, batched under vmap, or drops every key of a chunk, as for a padding-only one).

    Read off the device once for all the chunks: a read per chunk made a GPU wait for its queue
    to drain once per chunk and layer, and chunks multiply with T (issue 41)."""
    n = -(-q_len // rows)
    if masks is None or is_batchedtensor(masks):
        return [(0, kv_len)] * n
    kept = (masks > torch.finfo(masks.dtype).min / 2).flatten(0, -3).any(0)  # [Lq, Lk]
    kept = nn.functional.pad(kept, (0, 0, 0, n * rows - q_len)).view(n, rows, kv_len).any(1)
    first = kept.int().argmax(-1)  # [n]: the first kept key
    last = kv_len - kept.flip(-1).int().argmax(-1)  # one past the last
    some = kept.any(-1)
    bounds = torch.stack([torch.where(some, first, 0), torch.where(some, last, kv_len)])
    return list(zip(*bounds.tolist(), strict=True))


ALL_ATTENTION_FUNCTIONS.register(NAME, chunked_attention_forward)
ALL_MASK_ATTENTION_FUNCTIONS.register(NAME, eager_mask)
