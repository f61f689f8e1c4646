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
(eager attention for a model that cannot switch) and back.

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
from otb_diag.policy.forward_pass import (
    eval_mode,
    final_hidden,
    output_layer,
    pack_by_tokens,
    pad_batch,
)
from otb_diag.policy.scores import chunked_attention
from otb_diag.policy.scores.directions import Block, unit_pieces

_PREFIX = "lm."  # parameter names inside `_TokenLogProbs`
# Tokens whose fp32 logits `[chunk, V]` (and their tangents) are formed at once: 64 halves a
# 5 M model's peak memory against 256 at T = 256 (bench/README.md) at the same speed.
HEAD_CHUNK = 64


class _TokenLogProbs(nn.Module):
    """`forward(ids, attention, rows, pos, targets, tau) -> [N]` fp32 tempered log p of the
    tokens `ids[rows, pos]`, predicted from the final hidden states at `pos − 1`."""

    def __init__(self, model: nn.Module, chunk_size: int) -> None:
        super().__init__()
        self.lm, self.chunk_size = model, chunk_size

    def forward(
        self, ids: Tensor, attention: Tensor, rows: Tensor, pos: Tensor, tau: Tensor
    ) -> Tensor:
        hidden = final_hidden(self.lm, ids, attention)[rows, pos - 1]  # [N, d]
        weight, bias, scale, softcap = output_layer(self.lm)
        targets = ids[rows, pos]
        out = []
        for lo in range(0, len(rows), self.chunk_size):
            c = slice(lo, lo + self.chunk_size)
            z = (hidden[c].float() * scale) @ weight.float().T  # fp32 logits [chunk, V]
            if bias is not None:
                z = z + bias.float()
            if softcap is not None:
                z = softcap * torch.tanh(z / softcap)
            logp = torch.log_softmax(z / tau[c, None], dim=-1)
            out.append(logp.gather(-1, targets[c, None])[:, 0])
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
) -> Tensor:
    """`proj [B, T, K]` (K = Σ_b k_b) fp32 on the CPU, 0 at padding: `proj[i, t, offset_b + j] =
    ⟨v_{b,j}, ∇θ log p_t⟩` (module docstring).

    Responses are packed into padded batches of at most `batch_tokens` `prompt ⧺ response`
    tokens; each batch runs `⌈k_b / directions_batch⌉` vmapped jvps per block, every one over
    `directions_batch` tangents; the head's logits are formed `chunk_size` tokens at a time.
    `progress` gets the response tokens of a batch once all its directions are done. The model
    runs with the `attention` implementation (`forward_mode_attention`).
    """
    device = next(iter(params.values())).device
    n_rows, width = batch.response_ids.shape
    proj = torch.zeros(n_rows, width, sum(b.k for b in blocks))
    lengths = batch.length.tolist()
    wrapper = _TokenLogProbs(model, chunk_size)
    frozen = padding_rows(model)
    packed = [len(p) + n for p, n in zip(batch.prompt_ids, lengths, strict=True)]
    with torch.no_grad(), eval_mode(model), forward_mode_attention(model, attention):
        for group in pack_by_tokens(packed, batch_tokens):
            inputs, out_rows, cols = _padded(batch, group, device)
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
                        u.T.float().cpu() / math.sqrt(block.k)
                    )  # the jvp is linear in the tangent: 1/√k_b applied to [N, d], not to [d, D]
            if progress is not None:
                progress(sum(lengths[i] for i in group))
    return proj


def padding_rows(model: nn.Module) -> dict[str, int]:
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
    inputs = tuple(x.to(device) for x in (ids, attention, rows, pos, tau))
    return inputs, torch.tensor(group)[rows], cols
