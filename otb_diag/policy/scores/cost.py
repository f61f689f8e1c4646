"""Cost model of the two `full`-mode engines: time from a short calibration, memory from the
model's shape, and the choice between them (`--engine auto`).

Forward mode (`forward_mode.py`): `Σ_b ⌈k_b / d⌉` vmapped jvp calls per packed batch (d the
directions per call), each costing about 2 forward passes per direction, independent of T, and
per packed batch the draw of every direction's tangent over its block's parameters:

    forward_s ≈ Σ_b k_b · Σ_g padded_g · s_f(L_g)  +  s_r · batches · Σ_b k_b n_b,
    s_f(L) = a + b·L

with `padded_g` the padded tokens of packed batch g and `L_g` its row length, `s_f(L)` the
seconds per direction and token, timed on a calibration batch of about `calibration_tokens`
tokens (more on a GPU, whose cost per token falls as a call fills it) and, where the rows are
longer than twice that, on the longest row cut to 4 times it (the attention's keys per token grow
with L), each less its draws; and `s_r` the seconds per drawn element (a direction over all `n`
selected parameters timed apart): the draws do not grow with the tokens, so counting them per
token would overstate long batches and understate short ones.

Reverse mode (`reverse_mode.py`): per response token a backward pass over its chunk's prefix L
and a projection, `n · (6 L + 2 K)` flops:

    reverse_s ≈ s_b · Σ_t L_t  +  s_p · n · K · tokens  +  columns

with `s_b` measured by the reverse engine on a calibration batch (one direction), `s_p` by one
projection product, and `columns` the time to draw the `n × K` direction columns (once when
they are held, per product otherwise).

Memory (bytes, fp32 activations; `d` model width, `h` heads, `L` longest row, V vocabulary):
forward `model + d_dir · (n_b · e + 4 · n_t) + (1 + d_dir) · 4 · (tokens · 16 d + A · 2) +
4 · HEAD_BUFFERS · chunk · V` with `n_b` the largest block's parameters in their dtype's `e`
bytes and `n_t` the largest tensor's fp32 draw before its cast (none for fp32 parameters; it was
counted as `n_b · (4 + e)`, all the draws at once, which halved a GPU's directions per call:
`ModelShape.tangent_bytes`), and the output layer's tangent forming no `[chunk, V]` logits
(`forward_mode.TargetLogProb`),
with `A = rows · h · L²` the attention scores, `min(A, max(S, rows · h · L))` when they are
formed a query chunk of `S` scores at a time (`chunked_attention.py`; `S` from `scores_chunk_for`);
reverse
`layers · L · (34 d + 5 h L) · 4 + c · (3 · 4 · n + 4 · L · (16 d + 2 h L))` plus the held
columns and the pending gradients.
Each engine takes the largest batching that fits in `MEMORY_SHARE` of the memory available on the
device; one that does not fit at its smallest batching is not run (a clear error, never the
kernel's OOM killer). The head's chunk of tokens is planned first, from `HEAD_SHARE` of it, and
the attention's chunk of scores from `ATTENTION_SHARE` of it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

from otb_diag.errors import InputError
from otb_diag.maths.response_batch import ResponseBatch
from otb_diag.policy.causal_lm import causal_lm
from otb_diag.policy.forward_pass import BATCH_TOKENS, pack_by_tokens
from otb_diag.policy.placement import host_batch
from otb_diag.policy.scores.chunked_attention import SCORES_PER_CHUNK
from otb_diag.policy.scores.directions import Block, projection_columns, unit_pieces
from otb_diag.policy.scores.forward_mode import (
    HEAD_BUFFERS,
    HEAD_CHUNK,
    forward_scores,
    switchable,
)
from otb_diag.policy.scores.reverse_mode import HOLD_BYTES, PENDING_BYTES, reverse_scores
from otb_diag.runtime.devices import device_seconds
from otb_diag.runtime.memory import available_memory, rows_that_fit

# Padded tokens of forward mode's timed calibration call. The CPU's cost per token is flat from a
# few hundred tokens, so a short call suffices; a GPU's falls until a call fills the device, so
# 256 tokens mostly timed its launch overhead and the estimate came out 1.6-5.3x over on an H200
# (issue 41): there the call takes whole rows, as a real call does, up to GPU_CALIBRATION_TOKENS.
CALIBRATION_TOKENS = 256
GPU_CALIBRATION_TOKENS = 4096
# Forward mode on the CPU packs at most this many padded tokens per batch. Its cost per direction
# and token grows with the batch (25 M model, 8 directions, rows of 520 tokens, 2 threads:
# 1.05-1.35 µs at 520-1040 tokens a batch, 1.4-1.5 at 2080, 1.7-1.8 at 4160), as the tangents of
# the activations outgrow the caches; a GPU keeps `batch_tokens` (the larger, the busier).
CPU_FORWARD_BATCH_TOKENS = 1024
MEMORY_SHARE = 0.7
HEAD_SHARE = 0.1  # of the available memory, for the head's `[chunk, V]` fp32 buffers
MIN_HEAD_CHUNK = 16
MAX_HEAD_CHUNK = 4096  # on a GPU; the CPU keeps `HEAD_CHUNK` (cache-sized products)
ATTENTION_SHARE = 0.1  # of the available memory, for one query chunk's scores and their tangents
# On a GPU; the CPU keeps `SCORES_PER_CHUNK` (cache-sized). Larger chunks would skip less of a
# causal mask's upper triangle (`chunked_attention.py`).
# The GPU's chunks come from `ATTENTION_SHARE` of its memory, below this cap. A GPU runs forward
# mode bound by its host (issue 48: a vmapped jvp call costs the host some 0.3 s of Python and
# dispatch, and each query chunk of each layer adds its share), so its chunks are as large as
# memory allows: one chunk for a row of 2,048 tokens of Qwen2.5-1.5B (50.7 M scores), where the
# old cap, 2^24, cut it in 4 and the SmolLM2-1.7B batch's (64 × 520 tokens) in 33 a layer.
MAX_SCORES_PER_CHUNK = 1 << 28
SCORE_BUFFERS = 2  # fp32 `[B, heads, rows, keys]` tensors of a chunk: the scores, the weights
# Directions per vmapped jvp, largest that fits first. A GPU takes up to 16: its vmapped call
# costs the host about the same whatever the directions, so more of them share it; the CPU is
# bound by its arithmetic, and 8 keep the tangents in its caches (bench/README.md, run 4).
DIRECTION_BATCHES = (8, 4, 2, 1)
GPU_DIRECTION_BATCHES = (16, *DIRECTION_BATCHES)
DEFAULT_BUDGET_S = 7200.0
# `auto` keeps the reverse engine unless forward mode is this much cheaper: the reverse engine
# gives the exact per-token norms (optseq-true, otb-true, fidelity), forward mode estimates.
EXACT_NORMS_PREMIUM = 2.0
# Forward passes one jvp direction costs (3-4.7 on CPU in issue 10, 2.0-2.1 with issue 25's
# closed-form head), and a backward pass in forward passes: the flop counts of the deterministic
# engine choice (`work_counts`; kept at 3, as changing it would move `auto`'s choice).
JVP_PASSES = 3.0
BACKWARD_PASSES = 2.0


@dataclass
class FullPlan:
    """What a `full`-mode run will cost, and how it will run."""

    engine: str  # "jvp" or "vjp"
    n_params: int
    directions: int  # K = Σ_b k_b
    blocks: int
    tokens: int  # response tokens
    forward_s: float
    reverse_s: float
    forward_peak_bytes: float
    reverse_peak_bytes: float
    available_bytes: float
    directions_batch: int
    forward_batch_tokens: int  # padded tokens per forward-mode batch
    head_chunk: int  # tokens whose fp32 logits forward mode forms at once
    attention_scores: int  # scores of one query chunk of forward mode's attention
    reverse_chunk: int
    budget_s: float | None
    calibration: dict[str, float] = field(default_factory=dict)

    @property
    def estimate_s(self) -> float:
        return self.forward_s if self.engine == "jvp" else self.reverse_s

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "estimate_s": self.estimate_s}

    def describe(self) -> str:
        """One paragraph for the user, printed before the run."""
        gib = 1 << 30
        return (
            f"full mode: {self.n_params:,} parameters in {self.blocks} block(s), K = "
            f"{self.directions} directions, {self.tokens:,} response tokens; estimated "
            f"forward mode (jvp) {_duration(self.forward_s)}, peak "
            f"{self.forward_peak_bytes / gib:.2f} GiB; reverse mode (vjp) "
            f"{_duration(self.reverse_s)}, peak {self.reverse_peak_bytes / gib:.2f} GiB "
            f"(available {self.available_bytes / gib:.1f} GiB); running {self.engine}."
        )


def _duration(seconds: float) -> str:
    if not math.isfinite(seconds):
        return "not estimated (does not fit in memory, or another engine was asked for)"
    if seconds < 120:
        return f"{seconds:.0f} s"
    return f"{seconds / 60:.0f} min" if seconds < 7200 else f"{seconds / 3600:.1f} h"


def _shape(model: nn.Module) -> tuple[int, int, int, int]:
    """(width d, heads h, layers, vocabulary V) from any HF config (attribute maps included)."""
    config = model.config
    d = int(getattr(config, "hidden_size", 0) or 0)
    heads = int(getattr(config, "num_attention_heads", 1) or 1)
    layers = int(getattr(config, "num_hidden_layers", 1) or 1)
    vocab = int(model.get_output_embeddings().weight.shape[0])
    return d, heads, layers, vocab


def _rows(batch: ResponseBatch) -> list[tuple[int, int]]:
    """(prompt length P, response length T) of every row."""
    return [(len(p), int(n)) for p, n in zip(batch.prompt_ids, batch.length.tolist(), strict=True)]


def _prefix_work(rows: Sequence[tuple[int, int]], chunk: int) -> int:
    """`Σ_t L_t`: the prefix each token's chunk runs its backward passes over."""
    return sum(
        (min(lo + chunk, n) - lo) * (p + min(lo + chunk, n))
        for p, n in rows
        for lo in range(0, n, chunk)
    )


def _calibration_rows(batch: ResponseBatch, tokens: int) -> list[int]:
    """The first rows (in packing order, longest first) up to about `tokens` padded tokens."""
    lengths = [p + n for p, n in _rows(batch)]
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    chosen = [order[0]]
    for i in order[1:]:
        if (len(chosen) + 1) * lengths[chosen[0]] > tokens:
            break
        chosen.append(i)
    return chosen


def _sub_batch(batch: ResponseBatch, rows: list[int], max_tokens: int) -> ResponseBatch:
    """`batch` restricted to `rows`, responses cut to `max_tokens` tokens."""
    index = torch.tensor(rows)
    length = batch.length[index].clamp_max(max_tokens)
    return ResponseBatch(**{
        **vars(batch),
        "group": batch.group[index], "sample": batch.sample[index], "length": length,
        "prompt_ids": [batch.prompt_ids[i] for i in rows],
        "response_ids": batch.response_ids[index, :max_tokens],
        "valid": batch.valid[index, :max_tokens], "mask": batch.mask[index, :max_tokens],
        "token_rewards": batch.token_rewards[index, :max_tokens], "reward": batch.reward[index],
        "temperature": batch.temperature[index], "step": [batch.step[i] for i in rows],
        "is_weights": None, "logprobs": None, "sum_pi2": None,
    })  # fmt: skip


@dataclass(frozen=True)
class ModelShape:
    """What forward mode's memory plan reads off a model and its selected parameters: shapes
    and sizes, no weights (so a plan for a real model's shape is computed on the CPU from a
    model built on the meta device)."""

    width: int  # d
    heads: int
    layers: int
    vocab: int
    model_bytes: int  # every parameter, tied ones once
    selected: int  # n: the selected parameters' elements
    biggest_block: int  # elements of the largest block's parameters
    largest_tensor: int  # elements of the largest selected tensor
    element_size: int  # bytes of a selected parameter's element
    switchable: bool  # attention through transformers' interface (`forward_mode.switchable`)

    @classmethod
    def of(cls, model: nn.Module, params: dict[str, Tensor], blocks: Sequence[Block]) -> ModelShape:
        d, heads, layers, vocab = _shape(model)
        return cls(
            d, heads, layers, vocab, sum(p.numel() * p.element_size() for p in model.parameters()),
            sum(p.numel() for p in params.values()),
            max(sum(params[name].numel() for name in b.params) for b in blocks),
            max(p.numel() for p in params.values()), next(iter(params.values())).element_size(),
            switchable(model),
        )  # fmt: skip

    def tangent_bytes(self, directions: int) -> int:
        """The tangents of one vmapped call: `directions` of the largest block in the
        parameters' dtype, and the fp32 draw of one tensor before its cast (`unit_pieces`
        draws fp32; an fp32 parameter's draw is its tangent)."""
        draw = 0 if self.element_size == 4 else 4 * self.largest_tensor
        return directions * (self.biggest_block * self.element_size + draw)


@dataclass(frozen=True)
class ForwardLayout:
    """How forward mode runs a batch on a device (`forward_layout`): directions per vmapped
    call (0: none fits), padded tokens per packed batch, tokens of the head's fp32 logits at
    once, scores of one query chunk of the attention, and the peak memory it expects."""

    directions_batch: int
    batch_tokens: int
    head_chunk: int
    attention_scores: int
    peak_bytes: float
    query_chunks: int  # query chunks a layer of the longest packed batch runs
    groups: list[list[int]] = field(repr=False)


def forward_layout(
    shape: ModelShape,
    rows: Sequence[tuple[int, int]],
    device_type: str,
    available_bytes: float,
    *,
    batch_tokens: int = BATCH_TOKENS,
    head_chunk: int | None = None,
) -> ForwardLayout:
    """Forward mode's plan for `rows` ((prompt, response) lengths) on a device of `device_type`
    with `available_bytes` free: a pure function of the shapes (module docstring, "Memory"), so
    the plan of every GPU row is computed and tested on the CPU
    (tests/policy/scores/test_gpu_plans.py). The largest of `DIRECTION_BATCHES` (a GPU's:
    `GPU_DIRECTION_BATCHES`) whose peak fits in `MEMORY_SHARE` of the memory."""
    if device_type == "cpu":
        batch_tokens = min(batch_tokens, CPU_FORWARD_BATCH_TOKENS)
    groups = pack_by_tokens([p + t for p, t in rows], batch_tokens)
    longest = max(p + t for p, t in rows)
    tok_batch = max(len(g) * max(sum(rows[i]) for i in g) for g in groups)
    rows_max = max(len(g) for g in groups)
    head_chunk = head_chunk or head_chunk_for(device_type, shape.vocab, available_bytes)
    eager = tok_batch * shape.heads * longest  # eager scores [rows, heads, L, L]

    def attention(nd: int) -> int:
        """Scores alive at once: one query chunk's (chunked_attention.py) or all of them."""
        if not shape.switchable:
            return eager
        planned = scores_chunk_for(device_type, available_bytes, nd)
        return min(eager, max(planned, rows_max * shape.heads * longest))

    def peak(nd: int) -> float:
        acts = tok_batch * 16 * shape.width + attention(nd) * SCORE_BUFFERS
        head = HEAD_BUFFERS * 4 * head_chunk * shape.vocab
        return shape.model_bytes + shape.tangent_bytes(nd) + (1 + nd) * 4 * acts + head

    batches = DIRECTION_BATCHES if device_type == "cpu" else GPU_DIRECTION_BATCHES
    limit = MEMORY_SHARE * available_bytes
    nd = next((x for x in batches if peak(x) <= limit), 0)
    scores = attention(max(nd, 1))
    query_rows = max(1, scores // (rows_max * shape.heads * longest))
    return ForwardLayout(
        nd, batch_tokens, head_chunk, scores, peak(max(nd, 1)), -(-longest // query_rows), groups
    )


def plan_full(
    model: nn.Module,
    batch: ResponseBatch,
    params: dict[str, Tensor],
    blocks: Sequence[Block],
    seed: int,
    *,
    engine: str = "auto",
    budget_s: float | None = DEFAULT_BUDGET_S,
    force: bool = False,
    batch_tokens: int = BATCH_TOKENS,
    chunk_size: int = 32,
    head_chunk: int | None = None,
    available_bytes: float | None = None,
) -> FullPlan:
    """Estimate both engines (module docstring), choose one, and refuse what cannot run.

    engine: `auto` (of the engines that fit, the reverse one unless forward mode's counted work
    is less than 1/`EXACT_NORMS_PREMIUM` of it: `work_counts`), `jvp` or `vjp`. batch_tokens:
    forward mode's padded tokens per batch (at most `CPU_FORWARD_BATCH_TOKENS` on the CPU).
    head_chunk: forward mode's tokens of fp32 logits at once (default: `head_chunk_for`). Raises
    `InputError` when the chosen engine does not fit in memory, or its estimate exceeds
    `budget_s` and not `force`. A PEFT wrapper is planned as its causal LM (`causal_lm`).
    """
    model = causal_lm(model)
    if engine not in ("auto", "jvp", "vjp"):
        raise InputError(f"engine must be auto, jvp or vjp, got {engine!r}", field="engine")
    batch = host_batch(batch)  # its rows read on the host (any device given)
    device = next(iter(params.values())).device
    available = available_memory(device) if available_bytes is None else available_bytes
    shape = ModelShape.of(model, params, blocks)
    rows = _rows(batch)
    layout = forward_layout(
        shape, rows, device.type, available, batch_tokens=batch_tokens, head_chunk=head_chunk
    )
    nd, groups = layout.directions_batch, layout.groups
    n, d, heads, layers = shape.selected, shape.width, shape.heads, shape.layers
    k_total = sum(b.k for b in blocks)
    longest = max(p + t for p, t in rows)
    tokens = sum(t for _, t in rows)
    padded = sum(len(g) * max(rows[i][0] + rows[i][1] for i in g) for g in groups)

    def reverse_peak(c: int) -> float:
        stored = layers * longest * (34 * d + 5 * heads * longest) * 4
        per_token = 3 * 4 * n + 4 * longest * (16 * d + 2 * heads * longest)
        columns = min(HOLD_BYTES, n * k_total * 4)
        return shape.model_bytes + stored + c * per_token + columns + max(PENDING_BYTES, c * 4 * n)

    limit = MEMORY_SHARE * available
    chunk = next((c for c in range(chunk_size, 0, -1) if reverse_peak(c) <= limit), 0)
    calibration: dict[str, float] = {}
    forward_s = reverse_s = math.inf
    if nd and engine in ("auto", "jvp"):
        run = dict(
            batch_tokens=layout.batch_tokens, directions_batch=nd, chunk_size=layout.head_chunk,
            attention_scores=layout.attention_scores,
        )  # fmt: skip
        forward_s, more = _forward_estimate(model, batch, params, blocks, seed, groups, run)
        calibration.update(more)
    if chunk and engine in ("auto", "vjp"):
        reverse_s, more = _reverse_estimate(model, batch, params, seed, chunk, k_total, rows)
        calibration.update(more)
    if engine == "auto":
        # Chosen by counted work, not by the timings: a timing-based choice would change with
        # the machine's load (and per torchrun rank), and with it the per-token norms.
        forward_w, reverse_w = work_counts(model, n, k_total, padded, rows, chunk_size)
        engine = choose_engine(forward_w if nd else math.inf, reverse_w if chunk else math.inf)
    plan = FullPlan(
        engine, n, k_total, len(blocks), tokens, forward_s, reverse_s, layout.peak_bytes,
        reverse_peak(max(chunk, 1)), available, max(nd, 1), layout.batch_tokens,
        layout.head_chunk, layout.attention_scores, max(chunk, 1), budget_s, calibration,
    )  # fmt: skip
    if not math.isfinite(plan.estimate_s):
        peak = plan.forward_peak_bytes if plan.engine == "jvp" else plan.reverse_peak_bytes
        raise InputError(
            f"full mode ({plan.engine}) does not fit in memory: it needs about "
            f"{peak / 2**30:.1f} GiB at its smallest batching, {available / 2**30:.1f} GiB are "
            "available",
            field="mode",
            hint="Restrict the parameters (--params), shorten the responses, or use --mode head.",
        )
    if budget_s is not None and plan.estimate_s > budget_s and not force:
        raise InputError(
            f"{plan.describe()} That exceeds the budget of {_duration(budget_s)}.",
            field="budget",
            hint="Raise --budget, pass --force, fewer directions (--sketch-dim, "
            "--directions-per-block) or parameters (--params).",
        )
    return plan


def calibration_tokens(device: torch.device) -> int:
    """Padded tokens of forward mode's calibration call on `device` (see `CALIBRATION_TOKENS`)."""
    return GPU_CALIBRATION_TOKENS if device.type == "cuda" else CALIBRATION_TOKENS


def head_chunk_for(device: torch.device | str, vocab: int, available_bytes: float) -> int:
    """Forward mode's head chunk: the largest power of two whose `HEAD_BUFFERS` fp32 `[chunk, V]`
    buffers take at most `HEAD_SHARE` of `available_bytes`, at most `HEAD_CHUNK` on the CPU (its
    products run as fast at 256 tokens, in cache) and `MAX_HEAD_CHUNK` on a GPU."""
    largest = HEAD_CHUNK if torch.device(device).type == "cpu" else MAX_HEAD_CHUNK
    return rows_that_fit(
        available_bytes, HEAD_BUFFERS * 4 * vocab, share=HEAD_SHARE, smallest=MIN_HEAD_CHUNK,
        largest=largest,
    )  # fmt: skip


def scores_chunk_for(device: torch.device | str, available_bytes: float, directions: int) -> int:
    """Scores of one query chunk of the forward-mode attention: the largest power of two whose
    `SCORE_BUFFERS` fp32 buffers, for the primal and each of the `directions` tangents under
    `vmap`, take at most `ATTENTION_SHARE` of `available_bytes`; `SCORES_PER_CHUNK` on the CPU
    (cache-sized) and the floor, `MAX_SCORES_PER_CHUNK` the cap on a GPU."""
    largest = SCORES_PER_CHUNK if torch.device(device).type == "cpu" else MAX_SCORES_PER_CHUNK
    return rows_that_fit(
        available_bytes, SCORE_BUFFERS * 4 * (1 + directions), share=ATTENTION_SHARE,
        smallest=SCORES_PER_CHUNK, largest=largest,
    )  # fmt: skip


def work_counts(
    model: nn.Module,
    n: int,
    k_total: int,
    padded: int,
    rows: Sequence[tuple[int, int]],
    chunk: int,
) -> tuple[float, float]:
    """Flops of each engine, a deterministic function of the shapes (N model parameters, n
    selected, K directions): a token's forward pass costs 2N.

    forward ≈ JVP_PASSES · 2N · K · (padded prompt ⧺ response tokens)
    reverse ≈ (1 + BACKWARD_PASSES) · 2N · Σ_t L_t  +  2 n K · response tokens (projection)
    """
    total = sum(p.numel() for p in model.parameters())
    tokens = sum(t for _, t in rows)
    forward = JVP_PASSES * 2 * total * k_total * padded
    reverse = (1 + BACKWARD_PASSES) * 2 * total * _prefix_work(
        rows, chunk
    ) + 2 * n * k_total * tokens
    return forward, reverse


def choose_engine(forward: float, reverse: float) -> str:
    """`auto`: reverse mode (exact per-token norms) unless forward mode costs less than
    1/`EXACT_NORMS_PREMIUM` of it (`work_counts`); an engine that does not fit costs inf."""
    return "jvp" if forward * EXACT_NORMS_PREMIUM < reverse else "vjp"


def _forward_estimate(
    model: nn.Module,
    batch: ResponseBatch,
    params: dict[str, Tensor],
    blocks: Sequence[Block],
    seed: int,
    groups: list[list[int]],
    run: dict[str, int],
) -> tuple[float, dict[str, float]]:
    """Seconds of forward mode (module docstring): per direction and padded token
    `s(L) = a + b·L` of a batch whose rows are L tokens long (the attention's work per token
    grows with the keys it reads), timed on two cuts of the batch, and the draws timed apart.

    The first cut takes `calibration_tokens` tokens (rows cut to that length); the second, where
    the longest row is more than twice as long, that row cut to 4 times the first's length (a
    single short length had put the CPU's T = 2,048 row at 0.42x its measured time). Each call
    runs `min(directions_batch, largest k_b)` directions, as the real calls do.
    """
    device = next(iter(params.values())).device
    n = sum(p.numel() for p in params.values())
    directions = min(run["directions_batch"], max(b.k for b in blocks))
    one = [Block("calibration", tuple(params), directions, 0)]

    def seconds_per_token(cut: ResponseBatch) -> tuple[int, float]:
        """(padded row length L, seconds per direction and padded token) of one timed call."""
        t0 = device_seconds(device)
        forward_scores(model, cut, params, one, seed, **run)
        length = max(p + t for p, t in _rows(cut))
        return length, (device_seconds(device) - t0) / (directions * len(cut.prompt_ids) * length)

    forward_scores(
        model, _sub_batch(batch, _calibration_rows(batch, 1), 4), params, one, seed, **run
    )  # fmt: skip  (first-call costs, untimed)
    t0 = device_seconds(device)
    for name, p in params.items():
        unit_pieces(seed, range(1), name, p.shape, device)
    draw_s = device_seconds(device) - t0  # one direction over all n parameters
    size = min(calibration_tokens(device), run["batch_tokens"])
    short = _sub_batch(batch, _calibration_rows(batch, size), size)
    l1, s1 = seconds_per_token(short)
    s1 = max(s1 - draw_s / (len(short.prompt_ids) * l1), 0.0)  # the call drew each direction
    rows = _rows(batch)
    longest = max(p + t for p, t in rows)
    slope = 0.0
    if longest > 2 * l1:
        long = _sub_batch(batch, _calibration_rows(batch, 1), 4 * max(t for _, t in _rows(short)))
        l2, s2 = seconds_per_token(long)
        s2 = max(s2 - draw_s / l2, 0.0)
        slope = max((s2 - s1) / (l2 - l1), 0.0) if l2 > l1 else 0.0
    work = 0.0  # Σ_g padded_g · s(L_g)
    for g in groups:
        length = max(rows[i][0] + rows[i][1] for i in g)
        work += len(g) * length * (s1 + slope * (length - l1))
    drawn = len(groups) * sum(b.k * sum(params[x].numel() for x in b.params) for b in blocks)
    k_total = sum(b.k for b in blocks)
    return k_total * work + draw_s / n * drawn, {
        "forward_s_per_direction_token": s1,
        "forward_s_per_direction_token_per_key": slope,
        "forward_calibration_length": float(l1),
        "forward_draw_s_per_element": draw_s / n,
    }


def _reverse_estimate(
    model: nn.Module,
    batch: ResponseBatch,
    params: dict[str, Tensor],
    seed: int,
    chunk: int,
    k_total: int,
    rows: list[tuple[int, int]],
) -> tuple[float, dict[str, float]]:
    """Seconds of the reverse engine: backward (calibrated with one direction on a short batch),
    projection (one timed product) and drawing the columns (one timed direction)."""
    device = next(iter(params.values())).device
    n = sum(p.numel() for p in params.values())
    cal = _sub_batch(batch, _calibration_rows(batch, CALIBRATION_TOKENS), min(chunk, 16))
    one = [Block("calibration", tuple(params), 1, 0)]
    t0 = device_seconds(device)
    for name, p in params.items():
        projection_columns(seed, range(1), name, p.numel(), 1, device)
    draw_s = device_seconds(device) - t0  # one direction over all parameters
    t0 = device_seconds(device)
    reverse_scores(model, cal, params, one, seed, chunk)
    backward_s = max(device_seconds(device) - t0 - draw_s, 1e-9) / max(
        _prefix_work(_rows(cal), chunk), 1
    )
    width = min(n, 1 << 18)
    g, cols = torch.randn(chunk, width, device=device), torch.randn(width, k_total, device=device)
    t0 = device_seconds(device)
    g @ cols
    project_s = (device_seconds(device) - t0) / (chunk * width * k_total)
    tokens = sum(t for _, t in rows)
    products = 1 if n * k_total * 4 <= HOLD_BYTES else max(1, tokens * 4 * n // PENDING_BYTES)
    total = (
        backward_s * _prefix_work(rows, chunk)
        + project_s * n * k_total * tokens
        + draw_s * k_total * products
    )
    return total, {
        "reverse_s_per_prefix_token": backward_s,
        "projection_s_per_multiply_add": project_s,
        "direction_draw_s": draw_s,
    }
