"""Every row of issue 25's table on one GPU, in one run: one table and one JSON line.

    python bench/gpu.py            # CUDA: the real shapes (bf16, random weights, seeded)
    python bench/gpu.py --tiny     # the same rows on tiny shapes, on the CPU when there is no GPU
    make bench-gpu

The shapes are those of `../shared/gpu/shapes.py` (Qwen2.5-1.5B, Qwen3-8B, SmolLM2-1.7B), built
in memory on the device. Rows (target beside each):

- `full` mode, Qwen2.5-1.5B shape, one response of T = 512 and of T = 2,048, k = 64: forward-mode
  seconds per direction ÷ a bare forward (`model(ids)`), target ≤ 3; and the cost model's
  estimate ÷ the measured time (`--budget` honest: within 2×);
- the same at T = 8,192 with k = 16, measured and reported (no target);
- `full` mode, SmolLM2-1.7B shape, 64 responses of 512 tokens, k = 16: tokens/s, target ≥ 16 ×
  the 174 tok/s measured before issue 25;
- statistics pass (`checkpoint_stats`, planned chunk and batch), Qwen2.5-1.5B shape, T = 8,192,
  and Qwen3-8B shape, 8 × 32,768 tokens: ÷ a bare chunked log-prob forward (per row: backbone,
  then the head 4,096 tokens at a time, fp32 log-softmax, gather), target ≤ 1.15, and the peak
  memory of each (`PEAK_TARGET`: ≤ 1.25× the bare path's);
- `rollouts sample`'s sampler (`policy/sampling.py:sample_batch`), SmolLM2-1.7B shape, 256 rows ×
  512 new tokens: tokens/s ÷ a bare `generate` on the same batch, target ≥ 0.9.

Timings: one warm-up, then the median of `--reps` (CUDA synchronised). A row that fails prints
its error and the others still run. Not here (they need real files): `energy` end to end with a
tokenizer, and SmolLM2-135M from its GGUF (bench/README.md).
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass

import torch
import transformers
from bench_full import responses
from torch import nn
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

# From ../shared/gpu/shapes.py.
SHAPES = {
    "qwen2.5-1.5b": (Qwen2Config, Qwen2ForCausalLM, dict(vocab_size=151936, hidden_size=1536,
        intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12,
        num_key_value_heads=2, max_position_embeddings=32768, rope_theta=1e6,
        tie_word_embeddings=True)),
    "qwen3-8b": (Qwen2Config, Qwen2ForCausalLM, dict(vocab_size=151936, hidden_size=4096,
        intermediate_size=12288, num_hidden_layers=36, num_attention_heads=32,
        num_key_value_heads=8, max_position_embeddings=40960, rope_theta=1e6,
        tie_word_embeddings=False)),
    "smollm2-1.7b": (LlamaConfig, LlamaForCausalLM, dict(vocab_size=49152, hidden_size=2048,
        intermediate_size=8192, num_hidden_layers=24, num_attention_heads=32,
        num_key_value_heads=32, max_position_embeddings=8192, rope_theta=130000.0,
        tie_word_embeddings=True, bos_token_id=1, eos_token_id=2)),
}  # fmt: skip
TINY = dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2)  # fmt: skip
BARE_HEAD_CHUNK = 4096  # tokens of logits at once in the bare chunked log-prob forward
PEAK_TARGET = 1.25  # the statistics pass's peak memory ÷ the bare path's (issue 41)
BEFORE_FULL_TOK_S = 174.0  # full mode, SmolLM2-1.7B shape, 64 × 512 tokens, k = 16 (issue 25)


@dataclass
class Row:
    """One measurement: `shape` of the work, the measured `value` against `target` (`≤` or
    `≥`), and what the value means."""

    name: str
    shape: str
    value: float | None = None
    target: float | None = None
    sense: str = "<="
    unit: str = ""
    detail: str = ""
    error: str | None = None

    @property
    def met(self) -> bool | None:
        if self.value is None or self.target is None:
            return None
        return self.value <= self.target if self.sense == "<=" else self.value >= self.target


def build(shape: str, device: torch.device, tiny: bool) -> nn.Module:
    config_cls, model_cls, kwargs = SHAPES[shape]
    kwargs = {**kwargs, **TINY} if tiny else kwargs
    torch.manual_seed(0)
    dtype = torch.float32 if device.type == "cpu" else torch.bfloat16
    default = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with device:
            model = model_cls(config_cls(**kwargs))
    finally:
        torch.set_default_dtype(default)
    return model.eval()


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(fn: Callable[[], object], device: torch.device, reps: int) -> float:
    """Median wall seconds of `fn()` after one warm-up."""
    fn()
    times = []
    for _ in range(reps):
        sync(device)
        t0 = time.perf_counter()
        fn()
        sync(device)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def full_per_direction(model, device, tokens: int, k: int, reps: int) -> tuple[float, str]:
    """jvp seconds per direction ÷ bare forward, and the cost model's estimate ÷ measured."""
    from otb_diag.policy.scores.cost import plan_full
    from otb_diag.policy.scores.directions import Block, select_parameters
    from otb_diag.policy.scores.forward_mode import forward_scores

    batch = responses(model.config.vocab_size, 1, tokens)
    ids = torch.tensor([batch.prompt_ids[0] + batch.response_ids[0].tolist()], device=device)
    with torch.no_grad():
        bare = timed(lambda: model(ids, use_cache=False), device, reps)
    params = select_parameters(model, None)
    blocks = [Block("all", tuple(params), k, 0)]
    plan = plan_full(model, batch, params, blocks, 0, engine="jvp", budget_s=None)

    def run() -> None:
        forward_scores(
            model, batch, params, blocks, 0, batch_tokens=plan.forward_batch_tokens,
            directions_batch=plan.directions_batch, chunk_size=plan.head_chunk,
            attention_scores=plan.attention_scores,
        )  # fmt: skip

    seconds = timed(run, device, 1)
    detail = (
        f"{seconds / k:.3f} s/direction, bare {bare:.4f} s, {plan.directions_batch} directions "
        f"per vmap, head chunk {plan.head_chunk}; cost model {plan.forward_s:.1f} s for "
        f"{seconds:.1f} s measured ({plan.forward_s / seconds:.2f}x)"
    )
    return seconds / k / bare, detail


def full_throughput(model, device, rows: int, tokens: int, k: int) -> tuple[float, str]:
    from otb_diag.policy.scores.token_scores import token_scores

    batch = responses(model.config.vocab_size, rows, tokens)
    plans = []
    sync(device)
    t0 = time.perf_counter()
    token_scores(model, batch, "full", k, 0, engine="jvp", budget_s=None, on_plan=plans.append)
    sync(device)
    seconds = time.perf_counter() - t0
    estimate = plans[0].estimate_s
    return rows * tokens / seconds, (
        f"{seconds:.1f} s incl. calibration; estimate {estimate:.1f} s ({estimate / seconds:.2f}x)"
    )


def bare_chunked_logprobs(model, rows: list[torch.Tensor], prompt: int) -> None:
    """The baseline of the statistics pass: per row, the backbone, then the head a chunk of
    tokens at a time, fp32 log-softmax, gather of the next token."""
    head = model.get_output_embeddings()
    for ids in rows:
        hidden = model.base_model(ids[None], use_cache=False)[0][0, prompt - 1 : -1]
        targets = ids[prompt:]
        for lo in range(0, len(targets), BARE_HEAD_CHUNK):
            logits = head(hidden[lo : lo + BARE_HEAD_CHUNK]).float()
            logits.log_softmax(-1).gather(-1, targets[lo : lo + BARE_HEAD_CHUNK, None])


def stats_ratio(model, device, rows: int, tokens: int, reps: int) -> tuple[float, str]:
    from otb_diag.policy.forward_pass import checkpoint_stats, stats_plan

    batch = responses(model.config.vocab_size, rows, tokens)
    prompt = len(batch.prompt_ids[0])
    ids = [
        torch.tensor(p + r.tolist(), device=device)
        for p, r in zip(batch.prompt_ids, batch.response_ids, strict=True)
    ]
    with torch.no_grad():
        bare = timed(lambda: bare_chunked_logprobs(model, ids, prompt), device, reps)
        ours = timed(lambda: checkpoint_stats(model, batch), device, reps)
        memory = ""
        if device.type == "cuda":  # peak allocated above what was there before, each path
            peaks = [peak_bytes(lambda: bare_chunked_logprobs(model, ids, prompt), device),
                     peak_bytes(lambda: checkpoint_stats(model, batch), device)]  # fmt: skip
            memory = (
                f"; peak {peaks[1] / 2**30:.2f} GiB vs {peaks[0] / 2**30:.2f} GiB bare "
                f"({peaks[1] / peaks[0]:.2f}x, target <= {PEAK_TARGET})"
            )
    chunk, batch_tokens = stats_plan(model)
    return ours / bare, (
        f"{ours:.3f} s vs {bare:.3f} s bare; {rows * tokens / ours:,.0f} tok/s; planned chunk "
        f"{chunk}, batch tokens {batch_tokens}{memory}"
    )


def peak_bytes(fn: Callable[[], object], device: torch.device) -> int:
    """Bytes of device memory `fn()` allocates at its peak beyond what was allocated before."""
    sync(device)
    torch.cuda.reset_peak_memory_stats(device)
    before = torch.cuda.memory_allocated(device)
    fn()
    sync(device)
    return torch.cuda.max_memory_allocated(device) - before


def sampler_ratio(model, device, rows: int, new: int, reps: int) -> tuple[float, str]:
    from transformers import GenerationConfig

    from otb_diag.policy.noise import RowNoise
    from otb_diag.policy.sampling import Sampling, row_seed, sample_batch

    vocab = model.config.vocab_size
    gen = torch.Generator().manual_seed(2)
    prompts = torch.randint(3, vocab, (rows, 32), generator=gen).tolist()
    no_eos, pad = vocab + 7, 0  # an id never drawn: every row runs `new` steps
    ids = torch.tensor(prompts, device=device)
    config = GenerationConfig(do_sample=True, temperature=1.0, top_k=0, top_p=1.0,
                              max_new_tokens=new, min_new_tokens=new, eos_token_id=no_eos,
                              pad_token_id=pad)  # fmt: skip
    with torch.no_grad():
        bare = timed(
            lambda: model.generate(ids, attention_mask=torch.ones_like(ids),
                                   generation_config=config),
            device, reps,
        )  # fmt: skip
    noise = RowNoise([row_seed(0, i, 0) for i in range(rows)])
    ours = timed(
        lambda: sample_batch(model, prompts, noise, Sampling(1.0, 0, 1.0, new), eos_ids=[no_eos],
                             pad_id=pad),
        device, reps,
    )  # fmt: skip
    return bare / ours, f"{rows * new / ours:,.0f} tok/s vs bare generate {rows * new / bare:,.0f}"


def plan_rows(tiny: bool) -> list[tuple[Row, str, Callable]]:
    """(row, shape, measure(model, device, reps) -> (value, detail)) in the issue's order."""
    s = 16 if tiny else 1  # tiny: lengths and counts ÷ 16
    t512, t2k, t8k, t32k = 512 // s, 2048 // s, 8192 // s, 32768 // s
    k64, k16, rows64, rows256 = (4, 2, 4, 8) if tiny else (64, 16, 64, 256)
    per_dir = "bare fwd/dir"
    return [
        (Row("full mode T=512", f"qwen2.5-1.5b, 1 x {t512}, k {k64}", target=3, unit=per_dir),
         "qwen2.5-1.5b", lambda m, d, r: full_per_direction(m, d, t512, k64, r)),
        (Row("full mode T=2048", f"qwen2.5-1.5b, 1 x {t2k}, k {k64}", target=3, unit=per_dir),
         "qwen2.5-1.5b", lambda m, d, r: full_per_direction(m, d, t2k, k64, r)),
        (Row("full mode T=8192", f"qwen2.5-1.5b, 1 x {t8k}, k {k16}", unit=per_dir),
         "qwen2.5-1.5b", lambda m, d, r: full_per_direction(m, d, t8k, k16, r)),
        (Row("full mode batch", f"smollm2-1.7b, {rows64} x {t512}, k {k16}",
             target=16 * BEFORE_FULL_TOK_S, sense=">=", unit="tok/s"),
         "smollm2-1.7b", lambda m, d, r: full_throughput(m, d, rows64, t512, k16)),
        (Row("statistics pass", f"qwen2.5-1.5b, 1 x {t8k}", target=1.15, unit="x bare"),
         "qwen2.5-1.5b", lambda m, d, r: stats_ratio(m, d, 1, t8k, r)),
        (Row("energy statistics", f"qwen3-8b, 8 x {t32k}", target=1.15, unit="x bare"),
         "qwen3-8b", lambda m, d, r: stats_ratio(m, d, 8, t32k, r)),
        (Row("rollouts sample", f"smollm2-1.7b, {rows256} x {t512} new", target=0.9, sense=">=",
             unit="x bare generate"),
         "smollm2-1.7b", lambda m, d, r: sampler_ratio(m, d, rows256, t512, r)),
    ]  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tiny", action="store_true", help="tiny shapes (runs on the CPU too)")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--only", help="comma-separated row names to run (default: all)")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available() and not args.tiny:
        print("skipped: no CUDA")
        return 0
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    only = set(args.only.split(",")) if args.only else None
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor()
    print(f"device: {name}; torch {torch.__version__}, transformers {transformers.__version__}"
          f"{' (tiny shapes)' if args.tiny else ''}")  # fmt: skip
    # Each row is printed as soon as it is measured, so a run stopped by a time limit keeps
    # the rows it finished.
    print(f"{'row':<19} {'shape':<34} {'value':>10} {'target':>10}  met   detail", flush=True)
    rows, models = [], {}
    for row, shape, measure in plan_rows(args.tiny):
        if only is not None and row.name not in only:
            continue
        t0 = time.perf_counter()
        try:
            if shape not in models:
                models.clear()  # one shape in memory at a time (the 8 B one is 16 GB)
                if device.type == "cuda":
                    torch.cuda.empty_cache()
                models[shape] = build(shape, device, args.tiny)
            row.value, row.detail = measure(models[shape], device, args.reps)
        except Exception as error:  # a broken row is reported, the others still run
            row.error = f"{type(error).__name__}: {error}"
            traceback.print_exc()
        row.detail += f" [{time.perf_counter() - t0:.0f} s]"
        rows.append(row)
        value = "error" if row.value is None else f"{row.value:.2f}"
        met = {True: "yes", False: "NO", None: "-"}[row.met]
        target = "-" if row.target is None else row.target
        print(f"{row.name:<19} {row.shape:<34} {value:>10} {row.sense} {target:<7} {met:<5} "
              f"{row.unit}; {row.error or row.detail}", flush=True)  # fmt: skip
    print(json.dumps({
        "device": name, "torch": torch.__version__, "transformers": transformers.__version__,
        "tiny": args.tiny, "rows": [{**vars(r), "met": r.met} for r in rows],
    }))  # fmt: skip
    return 1 if any(r.error for r in rows) else 0


if __name__ == "__main__":
    raise SystemExit(main())
