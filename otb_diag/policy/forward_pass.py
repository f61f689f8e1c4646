"""Per-token statistics of the tempered policy from a forward pass (docs/theory.md §1–2).

With `π_t = softmax(z_t / τ)` and `p_t = π_t(y_t)`, every response token gets
`logprob = log p_t`, `prob = p_t`, `sum_pi2 = Σ_v π_t(v)²`, `entropy = −Σ_v π_t(v) log π_t(v)`,
the logit-gradient proxy `w = (1 − 2 p_t + sum_pi2) / τ² = ‖∂ log p_t / ∂z_t‖²` and, from a model,
`h_sq = ‖h_t‖²` of the final hidden state, so that `w · h_sq` is the exact squared norm of the
gradient of `log p_t` with respect to an untied, bias-free output layer.

Alignment: the logits at 0-based position `P + t − 2` are the distribution of the 1-based response
token `y_t`, which sits at position `P + t − 1` (`P` = prompt length).
Memory: the logits are rebuilt from the final hidden states through the output embedding in chunks
of tokens, so the extra memory is `O(chunk · V)` and `[B, T, V]` never exists.
"""

from __future__ import annotations

import contextlib
import functools
import weakref
from collections.abc import Callable, Iterator, Sequence
from dataclasses import fields, replace
from typing import Any

import torch
from torch import Tensor, nn

from otb_diag.errors import InputError
from otb_diag.maths.energy.token_stats import TokenStats, _stats_in_place
from otb_diag.maths.response_batch import ResponseBatch
from otb_diag.policy.causal_lm import causal_lm
from otb_diag.policy.placement import host_batch, input_device, to_device
from otb_diag.runtime.memory import available_memory, rows_that_fit


def pack_by_tokens(lengths: Sequence[int], batch_tokens: int) -> list[list[int]]:
    """Group sequence indices into batches whose padded size `n_rows · max_len` ≤ `batch_tokens`.

    Longest first (ties by index), so padding stays small and the order is deterministic; a
    sequence longer than the budget gets a batch of its own. Every index appears exactly once.
    """
    if batch_tokens < 1:
        raise InputError(f"batch_tokens must be at least 1, got {batch_tokens}")
    if any(n < 0 for n in lengths):
        raise InputError("sequence lengths must be non-negative")
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    batches: list[list[int]] = []
    for i in order:
        # Longest first: the first row of a batch sets its padded length.
        if batches and (len(batches[-1]) + 1) * lengths[batches[-1][0]] <= batch_tokens:
            batches[-1].append(i)
        else:
            batches.append([i])
    return batches


def pad_batch(
    prompts: Sequence[Sequence[int]], responses: Sequence[Sequence[int]]
) -> tuple[Tensor, Tensor, Tensor]:
    """Right-pad `prompt ⧺ response` rows: returns `input_ids [B, L]` long (pad id 0, never read),
    `attention_mask [B, L]` long and `response_start [B]` long (= P, the prompt lengths)."""
    if len(prompts) != len(responses):
        raise InputError(f"{len(prompts)} prompts but {len(responses)} responses")
    rows = [list(p) + list(r) for p, r in zip(prompts, responses, strict=True)]
    width = max((len(r) for r in rows), default=0)
    input_ids = torch.zeros(len(rows), width, dtype=torch.long)
    attention_mask = torch.zeros(len(rows), width, dtype=torch.long)
    for i, row in enumerate(rows):
        input_ids[i, : len(row)] = torch.tensor(row, dtype=torch.long)
        attention_mask[i, : len(row)] = 1
    return input_ids, attention_mask, torch.tensor([len(p) for p in prompts], dtype=torch.long)


def output_layer(model: nn.Module) -> tuple[Tensor, Tensor | None, float, float | None]:
    """The output layer as `(U [V, d], bias [V] or None, hidden scale s, softcap c or None)`.

    The logits are `c · tanh((U (s·h) + b) / c)` (no tanh when c is None). s folds the final
    logit scaling some architectures apply (Cohere `logit_scale`, Granite and MiniCPM3
    `logits_scaling`) into the hidden state, exact because their heads have no bias; c is Gemma-2's
    `final_logit_softcapping`. A PEFT wrapper's causal LM is read (`causal_lm`); an adapter on
    the output layer itself is refused (the logits are rebuilt from the layer's weight alone).
    """
    model = causal_lm(model)
    head = model.get_output_embeddings()
    if head is None or not isinstance(getattr(head, "weight", None), Tensor):
        raise InputError(f"{type(model).__name__} has no output embedding with a weight matrix")
    if isinstance(getattr(head, "base_layer", None), nn.Module):  # a PEFT tuner layer
        raise InputError(
            f"{type(model).__name__}: a PEFT adapter adapts the output layer "
            f"({type(head).__name__}), whose logits otb-diag rebuilds from the layer's weight "
            "alone.",
            hint="Leave the output layer out of the adapter's target_modules (or list it in "
            "modules_to_save, which trains a whole copy of it).",
        )
    config = model.config
    scale = 1.0
    if getattr(config, "logit_scale", None) is not None:
        scale *= float(config.logit_scale)
    if getattr(config, "logits_scaling", None) is not None:
        scale /= float(config.logits_scaling)
    bias = getattr(head, "bias", None)
    if bias is not None and scale != 1.0:
        raise InputError(f"{type(model).__name__}: a logit scale on a biased head is unsupported")
    return head.weight, bias, scale, getattr(config, "final_logit_softcapping", None)


def head_weight(weight: Tensor) -> Tensor:
    """The output embedding `[V, d]` as `head_logits` multiplies it, made once per pass: in the
    dtype `head_product_dtype` plans for its device (the weight itself: fp32, or bf16/fp16 on
    CUDA), else an fp32 copy (the upcast is exact), also where the device refuses the half
    product it was planned for (`_half_into_fp32`: an older torch, say)."""
    weight = weight.detach()
    planned = head_product_dtype(weight.device.type, weight.dtype)
    if planned == weight.dtype and (
        planned == torch.float32 or _half_into_fp32(weight.device.type, weight.dtype)
    ):
        return weight
    return weight.float()


# |rebuilt − the model's own| allowed by `check_output_layer`, relative to 1 + the largest |logit|:
# for a head run in fp32, and for one run in half precision (bf16/fp16 weights or autocast)
FP32_TOL, HALF_TOL = 1e-4, 3e-2
HALF_PRODUCT_DEVICES = ("cuda", "meta")  # where `torch.mm(..., out_dtype=torch.float32)` runs


def head_product_dtype(device_type: str, dtype: torch.dtype) -> torch.dtype:
    """The dtype in which the output layer's product takes its inputs, for a `dtype` weight on
    a device of `device_type`: a half-precision weight's own on CUDA (tensor cores with fp32
    sums and an fp32 result, issue 41: the fp32 product had been 46 % of the statistics pass's
    GPU time), fp32 elsewhere (the CPU has no half × half → fp32 product)."""
    half = dtype in (torch.bfloat16, torch.float16)
    return dtype if half and device_type in HALF_PRODUCT_DEVICES else torch.float32


@functools.cache
def _half_into_fp32(device_type: str, dtype: torch.dtype) -> bool:
    """Whether `torch.mm(a, b, out_dtype=torch.float32)` runs for `dtype` inputs on `device_type`
    (CUDA, and the meta device, in torch ≥ 2.8; the CPU does not), read once by trying it."""
    one = torch.ones(1, 1, dtype=dtype, device=device_type)
    try:
        return torch.mm(one, one, out_dtype=torch.float32).dtype == torch.float32
    except (RuntimeError, TypeError, NotImplementedError):
        return False


def head_logits(
    h: Tensor,
    weight: Tensor,
    bias: Tensor | None,
    softcap: float | None,
    scale: float = 1.0,
    out: Tensor | None = None,
) -> Tensor:
    """fp32 logits `[N, V]` `= c · tanh((U (s·h) + b) / c)` from the final hidden states `h [N, d]`
    (any dtype) and the output layer of `output_layer` with `weight` from `head_weight`.

    out: an `[N, V]` fp32 buffer to write them into (default: a new tensor).
    An fp32 weight multiplies `h` upcast, in fp32. A half-precision weight multiplies `h` in its
    own dtype, which is a half model's hidden state's already (its own head does the same), on the
    tensor cores with fp32 accumulation and an fp32 result: the same inputs as upcasting both, so
    only the order of the fp32 sums differs, while the upcast `[V, d]` weight and the fp32 product
    off the tensor cores had taken 46 % of the statistics pass's GPU time (issue 41).
    fp32 under a caller's autocast too (a trainer's `bf16=True` runs the live hooks inside one,
    which would otherwise multiply in bf16 and return bf16 logits).
    """
    with no_autocast(h.device):
        if weight.dtype != torch.float32:
            z = torch.mm(h.to(weight.dtype), weight.T, out_dtype=torch.float32, out=out)
            if scale != 1.0:  # s · (U h): s·h rounded to half precision would lose digits
                z.mul_(scale)  # (`output_layer` has no bias then)
            if bias is not None:
                z.add_(bias.float())
        else:
            h32 = h.float() * scale if scale != 1.0 else h.float()  # s·h: [N, d], not [N, V]
            if bias is None:
                z = torch.matmul(h32, weight.T, out=out)
            else:
                z = torch.addmm(bias.float(), h32, weight.T, out=out)  # U h + b in one pass
    if softcap is not None:
        z.div_(softcap).tanh_().mul_(softcap)  # c · tanh(z / c)
    return z


def no_autocast(device: torch.device) -> contextlib.AbstractContextManager:
    """Autocast off on `device`'s type inside (a no-op where none is on): otb-diag's own
    arithmetic keeps the precision it states whatever mixed precision its caller trains in."""
    if not torch.amp.is_autocast_available(device.type):
        return contextlib.nullcontext()  # a device with no autocast (meta) has none to switch off
    return torch.autocast(device.type, enabled=False)


@contextlib.contextmanager
def eval_mode(model: nn.Module) -> Iterator[None]:
    """Dropout off while measuring (the rollout policy had none); the caller's mode is restored."""
    was_training = model.training
    model.eval()
    try:
        yield
    finally:
        model.train(was_training)


def final_hidden(model: nn.Module, input_ids: Tensor, attention_mask: Tensor | None) -> Tensor:
    """Final hidden states `[B, L, d]` of the backbone (`model.base_model`), the LM head not run.

    Positions are passed explicitly as `0 … L−1`, which is right for right-padded rows. The ids
    and the mask go to the backbone's input device first (no copy where they are there). A PEFT
    wrapper's causal LM runs (`causal_lm`: its adapter active).
    """
    model = causal_lm(model)
    device = input_device(model)
    input_ids = input_ids.to(device)
    attention_mask = None if attention_mask is None else attention_mask.to(device)
    position_ids = torch.arange(input_ids.shape[1], device=input_ids.device).expand_as(input_ids)
    out = model.base_model(
        input_ids=input_ids,
        attention_mask=attention_mask,
        position_ids=position_ids,
        use_cache=False,
    )
    return out[0]  # last_hidden_state


# The models whose output layer `check_output_layer` has passed, each with what the verdict
# depends on (`_head_key`); weak, so a checked model is freed as if it had never been checked.
_CHECKED: weakref.WeakKeyDictionary[nn.Module, tuple] = weakref.WeakKeyDictionary()


def _head_key(model: nn.Module) -> tuple:
    """What `check_output_layer`'s verdict depends on: the head and backbone modules, the head's
    dtype, device and bias, the logit scale and soft-cap of its config, and a forward wrapped on
    the instance. Trained weights keep it (the head's transform is not in their values);
    `model.to(torch.bfloat16)`, another device, a swapped `lm_head`, a changed config or a
    forward wrapped by accelerate make the next call check again."""
    weight, bias, scale, softcap = output_layer(model)
    head, backbone = model.get_output_embeddings(), model.base_model
    forward = model.__dict__.get("forward")  # a wrapped forward (accelerate's autocast)
    return (
        id(head), id(backbone), id(forward), weight.dtype, weight.device, bias is None, scale,
        softcap,
    )  # fmt: skip


def check_output_layer(model: nn.Module, n_tokens: int = 8) -> None:
    """Raise InputError unless the logits rebuilt from the final hidden states match the model's.

    Once per model: a model that passed is not probed again while `_head_key` stays the same,
    so a statistics pass runs its backbone once per call, not twice (the probe is a whole
    forward of kernel launches, 56 attention calls where the bare path makes 28: issue 48).

    Catches heads this module does not know (an extra scaling, a transform, a backbone whose last
    hidden state is not what the head reads) on a short probe sequence: one forward of the model,
    whose backbone output is caught by a hook and multiplied through `head_logits`.

    The tolerance follows the precision the model's own head ran in, read off its output: 1e-4
    for fp32; 3e-2 where it ran in half precision, bf16/fp16 weights or an autocast around the
    forward (accelerate wraps a `bf16=True` trainer's `forward` in one, which a caller cannot
    switch off): half precision rounds the logits to ~3 significant digits (a default `attach`
    under `GRPOTrainer(bf16=True)` once failed here by 0.035 against the fp32 tolerance and
    switched the live diagnostics off). A caller's own autocast is switched off around the probe.
    A PEFT wrapper's causal LM is checked (`causal_lm`).
    """
    model = causal_lm(model)
    if model.base_model is model:
        raise InputError(f"{type(model).__name__} has no separate backbone; pass a *ForCausalLM")
    key = _head_key(model)
    if _CHECKED.get(model) == key:
        return
    _probe_output_layer(model, n_tokens)
    _CHECKED[model] = key


def _probe_output_layer(model: nn.Module, n_tokens: int) -> None:
    """`check_output_layer`'s probe: one forward of `n_tokens` ids, its logits against those
    rebuilt from its backbone's output."""
    weight, bias, scale, softcap = output_layer(model)
    ids = (torch.arange(n_tokens, device=weight.device) % weight.shape[0])[None]
    caught: dict[str, Tensor] = {}

    def keep(name: str) -> Callable[..., None]:
        def hook(_module: nn.Module, _args: Any, output: Any) -> None:  # None: output unchanged
            caught.setdefault(name, output if isinstance(output, Tensor) else output[0])

        return hook

    hooks = (
        model.base_model.register_forward_hook(keep("hidden")),  # last_hidden_state first
        model.get_output_embeddings().register_forward_hook(keep("head")),
    )
    try:
        with torch.no_grad(), eval_mode(model), no_autocast(weight.device):
            ref = model(input_ids=ids, attention_mask=torch.ones_like(ids), use_cache=False)
    finally:
        for hook in hooks:
            hook.remove()
    ref = ref.logits[0].float()
    if "hidden" not in caught:
        raise InputError(
            f"{type(model).__name__}: its forward does not run its backbone "
            f"({type(model.base_model).__name__}), so its logits cannot be rebuilt"
        )
    z = head_logits(caught["hidden"][0], head_weight(weight), bias, softcap, scale)
    head_dtype = caught["head"].dtype if "head" in caught else weight.dtype
    tol = FP32_TOL if head_dtype == torch.float32 else HALF_TOL
    err = (z - ref).abs().max().item()
    if err > tol * (1.0 + ref.abs().max().item()):
        raise InputError(
            f"{type(model).__name__}: logits rebuilt from the final hidden states and the output "
            f"embedding differ from the model's own by {err:.3g} (its head ran in "
            f"{str(head_dtype).removeprefix('torch.')}, tolerance {tol:g} relative to the "
            "largest logit); its head applies a transform otb-diag does not support"
        )


# Statistics pass defaults. The CPU keeps `[chunk, V]` buffers small enough to stay in cache and
# batches of `BATCH_TOKENS`; on CUDA both come from the free memory (`stats_plan`), capped where a
# larger size only adds memory: 4,096 tokens already keep the head's product on the tensor cores
# busy, and a batch of 32,768 tokens is as long as the longest response users score (an 8,192-token
# chunk's two fp32 buffers, 10 GiB at V = 151,936, had made the pass's peak 1.8× a bare forward's).
STATS_CHUNK = 256
BATCH_TOKENS = 16384
STATS_BUFFERS = 2  # fp32 `[chunk, V]` buffers of the statistics pass: the logits and the scratch
ACTIVATION_BYTES_PER_WIDTH = (
    16 * 4
)  # fp32 activations of a no-grad forward, per token and unit of d
PLANNED_SHARE = 0.25  # of the free memory, for each of the two: the logit chunk, the batch
MAX_STATS_CHUNK = 4096
MAX_BATCH_TOKENS = 1 << 15


def stats_plan(model: nn.Module, free_bytes: float | None = None) -> tuple[int, int]:
    """`(chunk_size, batch_tokens)` of the statistics pass on `model`'s device (`stats_layout`):
    `STATS_CHUNK` and `BATCH_TOKENS` off CUDA unless `free_bytes` is given; on CUDA planned from
    `free_bytes` (default: what the device has free now)."""
    weight = output_layer(causal_lm(model))[0]
    if weight.device.type != "cuda" and free_bytes is None:
        return STATS_CHUNK, BATCH_TOKENS
    free = available_memory(weight.device) if free_bytes is None else free_bytes
    vocab, width = weight.shape
    return stats_layout(vocab, width, "cuda", free)


def stats_layout(vocab: int, width: int, device_type: str, free_bytes: float) -> tuple[int, int]:
    """`(chunk_size, batch_tokens)` of the statistics pass for an output layer `[V, d]` on a
    device of `device_type` with `free_bytes` free, a pure function of them (the GPU rows' plans
    are tested on the CPU: tests/policy/scores/test_gpu_plans.py): the CPU's `STATS_CHUNK` and
    `BATCH_TOKENS`; on CUDA the largest powers of two whose `[chunk, V]` fp32 buffers and whose
    batch's activations (`16 d` fp32 per token) each take at most `PLANNED_SHARE` of
    `free_bytes`, never below the CPU's sizes nor above `MAX_STATS_CHUNK`, `MAX_BATCH_TOKENS`."""
    if device_type != "cuda":
        return STATS_CHUNK, BATCH_TOKENS
    chunk = rows_that_fit(
        free_bytes, STATS_BUFFERS * 4 * vocab, share=PLANNED_SHARE, smallest=STATS_CHUNK,
        largest=MAX_STATS_CHUNK,
    )  # fmt: skip
    tokens = rows_that_fit(
        free_bytes, ACTIVATION_BYTES_PER_WIDTH * width, share=PLANNED_SHARE,
        smallest=BATCH_TOKENS, largest=MAX_BATCH_TOKENS,
    )  # fmt: skip
    return chunk, tokens


def response_token_stats(
    model: nn.Module,
    input_ids: Tensor,
    attention_mask: Tensor,
    response_start: Tensor,
    temperature: float | Tensor = 1.0,
    chunk_size: int = STATS_CHUNK,
    check_head: bool = True,
) -> TokenStats:
    """Statistics of every response token of a right-padded batch, `[B, T]` with `T = max_i T_i`.

    model: a Hugging Face causal LM (`*ForCausalLM`); run under no_grad, in eval mode.
    input_ids: `[B, L]` long, rows `prompt ⧺ response` then padding (see `pad_batch`).
    attention_mask: `[B, L]`, 1 on the `P_i + T_i` real tokens, which come first in each row.
    response_start: `[B]` long, the prompt length `P_i ≥ 1` of each row.
    temperature: a float or a `[B]` tensor of per-row sampling temperatures.
    chunk_size: tokens whose `[chunk, V]` logits exist at once.
    check_head: verify first that the logits can be rebuilt (`check_output_layer`).
    Returns fp32 `TokenStats [B, T]` on the model's device, `h_sq` included; entry `[i, t]` is
    response token `t + 1` (1-based) of row i, and is 0 where `t ≥ T_i`.
    Memory beyond the forward pass: two `[chunk, V]` fp32 buffers (plus, off CUDA, an fp32 copy
    of a half-precision output embedding, `head_weight`).
    The tensors may come on any devices: the mask, the starts and the temperatures are moved
    once to the ids' device, where they are checked and indexed (the CPU for `checkpoint_stats`,
    so nothing here waits for the model's device), then queued to the model's device.
    A PEFT-wrapped model runs as its causal LM (`causal_lm`).
    """
    model = causal_lm(model)
    if input_ids.ndim != 2 or attention_mask.shape != input_ids.shape:
        raise InputError("input_ids and attention_mask must both be [B, L]")
    if chunk_size < 1:
        raise InputError(f"chunk_size must be at least 1, got {chunk_size}")
    if check_head:
        check_output_layer(model)
    weight, bias, scale, softcap = output_layer(model)
    device = weight.device
    # Moved once, here: the checks and the index work run where the ids are, whatever device
    # the mask, the starts and the temperatures came on (`placement.py`).
    here = input_ids.device
    attention_mask = attention_mask.to(here)
    start = torch.as_tensor(response_start).to(here, torch.long)
    if start.shape != input_ids.shape[:1]:
        raise InputError(
            f"response_start must be [B], B = {len(input_ids)}; got {list(start.shape)}"
        )
    n_real = attention_mask.sum(-1)
    positions = torch.arange(input_ids.shape[1], device=here)
    if (attention_mask.bool() != (positions[None] < n_real[:, None])).any():
        raise InputError("attention_mask must be right-padded: each row's 1s come first")
    if (start < 1).any() or (start > n_real).any():
        raise InputError("response_start must lie in [1, number of real tokens] for every row")
    tau = torch.as_tensor(temperature, dtype=torch.float32).to(here).expand(len(start))
    if (tau <= 0).any():
        raise InputError("temperature must be positive")
    tempered = bool((tau != 1).any())

    length = n_real - start  # T_i
    t = torch.arange(int(length.max()), device=start.device)
    rows, cols = (t[None] < length[:, None]).nonzero(as_tuple=True)  # the N valid (i, t) pairs
    target_pos = start[rows] + cols  # 0-based position of response token t + 1 (1-based)
    input_ids, attention_mask, rows, cols, target_pos = (
        to_device(x, device) for x in (input_ids, attention_mask, rows, cols, target_pos)
    )
    tau = to_device(tau.contiguous(), device)

    parts = []
    with torch.no_grad(), eval_mode(model):
        # A mask of ones: the rows are right-padded (checked above), so causal attention never
        # reads the padding from a real token, and the backbone runs the same unmasked causal
        # attention kernel as a bare forward (the padding mask made it take three attention calls
        # a layer on CUDA). Ones rather than None: transformers warns about padding without one.
        hidden = final_hidden(model, input_ids, torch.ones_like(input_ids))
        h = hidden[rows, target_pos - 1]  # [N, d]: the logits at P + t − 2 predict y_t (1-based t)
        targets = input_ids[rows, target_pos]  # [N]
        weight_h = head_weight(weight)  # fp32 products of a half weight without an fp32 copy
        # The logits and the statistics' scratch, [chunk, V] each, reused by every chunk.
        z_buf = torch.empty(min(chunk_size, len(rows)), weight.shape[0], device=device)
        e_buf = torch.empty_like(z_buf)
        for lo in range(0, len(rows), chunk_size):
            chunk = slice(lo, lo + chunk_size)
            hc = h[chunk]  # [chunk, d] in the model's dtype
            n = len(hc)
            z = head_logits(hc, weight_h, bias, softcap, scale, out=z_buf[:n])  # [chunk, V]
            chunk_tau = tau[rows[chunk]] if tempered else None
            s = _stats_in_place(z, targets[chunk], chunk_tau, e_buf[:n])
            h_sq = (hc.float() * scale).square().sum(-1)  # ‖s·h_t‖², what the head reads
            parts.append(replace(s, h_sq=h_sq))

    def to_grid(name: str) -> Tensor:
        grid = torch.zeros(len(start), len(t), device=device)
        if parts:
            grid[rows, cols] = torch.cat([getattr(p, name) for p in parts])
        return grid

    return TokenStats(**{f.name: to_grid(f.name) for f in fields(TokenStats)})


def stats_for_sequences(
    model: nn.Module,
    prompts: Sequence[Sequence[int]],
    responses: Sequence[Sequence[int]],
    temperature: float | Sequence[float] = 1.0,
    chunk_size: int | None = None,
    batch_tokens: int | None = None,
    progress: Callable[[int], None] | None = None,
) -> list[TokenStats]:
    """`response_token_stats` over many `(prompt, response)` token-id pairs, batched by tokens.

    temperature: one float or one per sequence. chunk_size, batch_tokens: `stats_plan`'s unless
    given.
    progress: called with the number of response tokens of each finished batch.
    Returns, in input order, one `TokenStats [T_i]` per response, on the CPU. A PEFT-wrapped
    model runs as its causal LM (`causal_lm`).
    """
    model = causal_lm(model)
    if len(prompts) != len(responses):
        raise InputError(f"{len(prompts)} prompts but {len(responses)} responses")
    taus = torch.as_tensor(temperature, dtype=torch.float32).cpu().expand(len(prompts))
    lengths = torch.tensor([len(r) for r in responses], dtype=torch.long)
    grids = _stats_grids(
        model, prompts, responses, lengths, taus, chunk_size, batch_tokens, progress
    )
    return [
        TokenStats(**{name: grid[i, : int(n)] for name, grid in grids.items()})
        for i, n in enumerate(lengths)
    ]


def checkpoint_stats(
    model: torch.nn.Module,
    batch: ResponseBatch,
    *,
    batch_tokens: int | None = None,
    chunk_size: int | None = None,
    progress: Callable[[int], None] | None = None,
) -> TokenStats:
    """Per-token statistics of every response under the checkpoint, `[B, T]` fp32 on the CPU, 0 on
    padding (`response_token_stats` per packed batch; chunk_size, batch_tokens: `stats_plan`'s
    unless given).

    `progress(n)` is called with the number of response tokens of each finished model batch.
    The batch's tensors may be on any device (read on the host: `placement.host_batch`); a
    PEFT-wrapped model runs as its causal LM (`causal_lm`)."""
    model = causal_lm(model)
    batch = host_batch(batch)
    rows = batch.response_ids.tolist()  # the inputs' ids, read once; the statistics stay tensors
    responses = [ids[:n] for ids, n in zip(rows, batch.length.tolist(), strict=True)]
    grids = _stats_grids(
        model, batch.prompt_ids, responses, batch.length, batch.temperature, chunk_size,
        batch_tokens, progress, width=batch.response_ids.shape[1],
    )  # fmt: skip
    return TokenStats(**grids)


def _stats_grids(
    model: nn.Module,
    prompts: Sequence[Sequence[int]],
    responses: Sequence[Sequence[int]],
    lengths: Tensor,
    taus: Tensor,
    chunk_size: int | None,
    batch_tokens: int | None,
    progress: Callable[[int], None] | None,
    width: int | None = None,
) -> dict[str, Tensor]:
    """`{statistic: [B, width]}` fp32 on the CPU (width: the longest response by default): every
    model batch's statistics written into grids on the model's device, copied to the CPU once,
    when all the batches are done."""
    check_output_layer(model)
    planned_chunk, planned_tokens = stats_plan(model)
    chunk_size = chunk_size or planned_chunk
    batch_tokens = batch_tokens or planned_tokens
    device = output_layer(model)[0].device
    n_resp = lengths.tolist()
    width = max(n_resp, default=0) if width is None else width
    grids = {f.name: torch.zeros(len(n_resp), width, device=device) for f in fields(TokenStats)}
    packed = [len(p) + n for p, n in zip(prompts, n_resp, strict=True)]
    for group in pack_by_tokens(packed, batch_tokens):
        ids, mask, start = pad_batch([prompts[i] for i in group], [responses[i] for i in group])
        stats = response_token_stats(
            model, ids, mask, start, taus[group], chunk_size, check_head=False
        )
        index = to_device(torch.tensor(group), device)
        for name, grid in grids.items():
            value = getattr(stats, name)  # [rows, T_group], 0 beyond each row's T_i
            grid[index, : value.shape[1]] = value
        if progress is not None:
            progress(sum(n_resp[i] for i in group))
    return {name: grid.cpu() for name, grid in grids.items()}
