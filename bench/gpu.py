"""Every row of issue 25's table on one GPU, each in its own process under a time limit, within
a budget that fits a short GPU loan: one table and one JSON line.

    python bench/gpu.py            # CUDA: the real shapes (bf16, random weights, seeded)
    python bench/gpu.py --tiny --in-process   # the same rows on tiny shapes, on the CPU
    make bench-gpu                 # this, then pytest -m gpu tests/gpu

The shapes are those of `../shared/gpu/shapes.py` (Qwen2.5-1.5B, Qwen3-8B, SmolLM2-1.7B), built
in memory on the device. Rows (target beside each):

- `full` mode, Qwen2.5-1.5B shape, one response of T = 512 and of T = 2,048, k = 64: forward-mode
  seconds per direction ÷ a bare forward (`model(ids)`), target ≤ 3; and the cost model's
  estimate ÷ the measured time (`--budget` honest: within 2×);
- the same at T = 8,192 with k = 16, target ≤ 4 (issue 48);
- `full` mode, SmolLM2-1.7B shape, 64 responses of 512 tokens, k = 16: tokens/s, target ≥ 16 ×
  the 174 tok/s measured before issue 25;
- statistics pass (`checkpoint_stats`, planned chunk and batch), Qwen2.5-1.5B shape, T = 8,192,
  and Qwen3-8B shape, 8 × 32,768 tokens: ÷ a bare chunked log-prob forward (per row: backbone,
  then the head 4,096 tokens at a time, fp32 log-softmax, gather), target ≤ 1.15, and the peak
  memory of each (`PEAK_TARGET`: ≤ 1.25× the bare path's);
- `rollouts sample`'s sampler (`policy/sampling.py:sample_batch`), SmolLM2-1.7B shape, 256 rows ×
  512 new tokens: tokens/s ÷ a bare `generate` on the same batch over 3 repetitions, target ≥ 0.9;
- the live trainer (`bench_live.py --gpu`: `attach` on a real `GRPOTrainer` on the GPU), its own
  output printed (its figures and targets are its own).

Each row runs in a process of its own (`row_runner.py`) under its limit (`LIMITS`), printed as it
finishes, so a row that hangs or runs long costs only its limit: a row that times out is
reported so and the next one starts. The rows' limits and the whole run's (`--budget`, 480 s)
are sized to fit a GPU lent for 15 minutes with `pytest -m gpu tests/gpu` after them.
Timings: the median of each row's repetitions (`REPS`; `--reps` for all) after a warm-up (for
the full-mode rows, the cost model's calibration calls; for the energy row, one of its 8 rows;
for the sampler, 8 new tokens), CUDA synchronised. A row that fails prints its error and the
others still run. Not here (they need real files): `energy` end to end with a
tokenizer, and SmolLM2-135M from its GGUF (bench/README.md).
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
import transformers
from bench_full import responses
from row_runner import Job, python, run_jobs
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
LIVE = "live trainer"  # the row `bench_live.py --gpu` runs
# Seconds each row's process may run (imports and the model's build included), from the H100 and
# H200 runs of 26-28 Nov (bench/README.md) with room: their sum, 555 s, is more than `BUDGET_S`,
# which stops the run where the rows ran long together.
LIMITS = {
    "full mode T=512": 45, "full mode T=2048": 50, "full mode T=8192": 60,
    "full mode batch": 70, "statistics pass": 30, "energy statistics": 80,
    "rollouts sample": 120, LIVE: 150,
}  # fmt: skip
BUDGET_S = 480  # the rows together: 8 minutes, `pytest -m gpu tests/gpu` after them
# Timed repetitions of each row (median): the sampler's 3 are issue 41's target; the energy row's
# one call is 12-19 s; the full-mode rows time one whole pass (64 or 16 directions).
REPS = {"rollouts sample": 3, "statistics pass": 3}


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


def timed(
    fn: Callable[[], object], device: torch.device, reps: int,
    warm: Callable[[], object] | None = None,
) -> float:  # fmt: skip
    """Median wall seconds of `reps` calls of `fn()` after one warm-up call of `warm` (default
    `fn` itself; `skip_warm_up` when the caller has warmed it already)."""
    (fn if warm is None else warm)()
    times = []
    for _ in range(reps):
        sync(device)
        t0 = time.perf_counter()
        fn()
        sync(device)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def skip_warm_up() -> None:
    """`timed`'s warm-up where the row's own set-up has run the same code already."""


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

    seconds = timed(run, device, reps, warm=skip_warm_up)  # plan_full's calibration warmed it
    detail = (
        f"{seconds / k:.3f} s/direction, bare {bare:.4f} s, {plan.directions_batch} directions "
        f"per vmap, head chunk {plan.head_chunk}, {plan.attention_scores:,} scores a query chunk; "
        f"cost model {plan.forward_s:.1f} s for "
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
    """`checkpoint_stats` ÷ the bare chunked forward, each timed (and its peak memory read) on
    the same calls after a warm-up on the first row (the output layer's check included)."""
    from bench_full import _sub_batch

    from otb_diag.policy.forward_pass import checkpoint_stats, stats_plan

    batch = responses(model.config.vocab_size, rows, tokens)
    prompt = len(batch.prompt_ids[0])
    ids = [
        torch.tensor(p + r.tolist(), device=device)
        for p, r in zip(batch.prompt_ids, batch.response_ids, strict=True)
    ]
    first = _sub_batch(batch, [0], tokens)
    with torch.no_grad():
        bare, bare_peak = timed_peak(
            lambda: bare_chunked_logprobs(model, ids, prompt), device, reps,
            warm=lambda: bare_chunked_logprobs(model, ids[:1], prompt),
        )  # fmt: skip
        ours, our_peak = timed_peak(
            lambda: checkpoint_stats(model, batch), device, reps,
            warm=lambda: checkpoint_stats(model, first),
        )  # fmt: skip
    memory = ""
    if device.type == "cuda":  # peak allocated above what was there before, each path
        memory = (
            f"; peak {our_peak / 2**30:.2f} GiB vs {bare_peak / 2**30:.2f} GiB bare "
            f"({our_peak / bare_peak:.2f}x, target <= {PEAK_TARGET})"
        )
    chunk, batch_tokens = stats_plan(model)
    return ours / bare, (
        f"{ours:.3f} s vs {bare:.3f} s bare; {rows * tokens / ours:,.0f} tok/s; planned chunk "
        f"{chunk}, batch tokens {batch_tokens}{memory}"
    )


def timed_peak(
    fn: Callable[[], object], device: torch.device, reps: int, warm: Callable[[], object]
) -> tuple[float, int]:
    """`timed`'s median seconds of `fn()`, and the device memory its first timed call allocated
    at its peak beyond what was allocated before (0 off CUDA): one set of calls for both."""
    warm()
    times, peaks = [], []
    for _ in range(reps):
        sync(device)
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
            before = torch.cuda.memory_allocated(device)
        t0 = time.perf_counter()
        fn()
        sync(device)
        times.append(time.perf_counter() - t0)
        if device.type == "cuda":
            peaks.append(torch.cuda.max_memory_allocated(device) - before)
    return statistics.median(times), (peaks[0] if peaks else 0)


def sampler_ratio(model, device, rows: int, new: int, reps: int) -> tuple[float, str]:
    from transformers import GenerationConfig

    from otb_diag.policy.noise import RowNoise
    from otb_diag.policy.sampling import Sampling, row_seed, sample_batch

    vocab = model.config.vocab_size
    gen = torch.Generator().manual_seed(2)
    prompts = torch.randint(3, vocab, (rows, 32), generator=gen).tolist()
    no_eos, pad = vocab + 7, 0  # an id never drawn: every row runs `new` steps
    ids = torch.tensor(prompts, device=device)
    noise = RowNoise([row_seed(0, i, 0) for i in range(rows)])

    def bare(steps: int = new) -> None:
        config = GenerationConfig(do_sample=True, temperature=1.0, top_k=0, top_p=1.0,
                                  max_new_tokens=steps, min_new_tokens=steps,
                                  eos_token_id=no_eos, pad_token_id=pad)  # fmt: skip
        model.generate(ids, attention_mask=torch.ones_like(ids), generation_config=config)

    def ours(steps: int = new) -> None:
        sample_batch(model, prompts, noise, Sampling(1.0, 0, 1.0, steps), eos_ids=[no_eos],
                     pad_id=pad)  # fmt: skip

    # Paired: each repetition times the bare `generate`, then the sampler, so that a drift of
    # the machine's speed over the row moves both; the figure is the median of the ratios.
    ratios, speeds = [], []
    with torch.no_grad():
        for r in range(reps):
            warm = (lambda: bare(8)) if r == 0 else skip_warm_up
            b = timed(bare, device, 1, warm=warm)
            o = timed(ours, device, 1, warm=(lambda: ours(8)) if r == 0 else skip_warm_up)
            ratios.append(b / o)
            speeds.append((rows * new / o, rows * new / b))
    ours_tok, bare_tok = speeds[ratios.index(statistics.median(ratios))]
    return statistics.median(ratios), (
        f"{ours_tok:,.0f} tok/s vs bare generate {bare_tok:,.0f} (median of {reps} paired "
        f"repetitions; ratios {', '.join(f'{x:.3f}' for x in ratios)})"
    )


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
        (Row("full mode T=8192", f"qwen2.5-1.5b, 1 x {t8k}, k {k16}", target=4, unit=per_dir),
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


def measured(row: Row, shape: str, measure: Callable, device, tiny: bool, reps: int, models) -> Row:
    """`row` measured in this process (its model built, or reused from `models`, one shape in
    memory at a time), its line printed; an error is the row's, not the run's."""
    t0 = time.perf_counter()
    try:
        if shape not in models:
            models.clear()  # one shape in memory at a time (the 8 B one is 16 GB)
            if device.type == "cuda":
                torch.cuda.empty_cache()
            models[shape] = build(shape, device, tiny)
        row.value, row.detail = measure(models[shape], device, reps)
    except Exception as error:  # a broken row is reported, the others still run
        row.error = f"{type(error).__name__}: {error}"
        traceback.print_exc()
    row.detail += f" [{time.perf_counter() - t0:.0f} s]"
    print(row_line(row), flush=True)
    return row


def row_line(row: Row) -> str:
    value = "error" if row.value is None else f"{row.value:.2f}"
    met = {True: "yes", False: "NO", None: "-"}[row.met]
    target = "-" if row.target is None else row.target
    return (
        f"{row.name:<19} {row.shape:<34} {value:>10} {row.sense} {target:<7} {met:<5} "
        f"{row.unit}; {row.error or row.detail}"
    )


HEADER = f"{'row':<19} {'shape':<34} {'value':>10} {'target':>10}  met   detail"


def jobs(names: list[str], tiny: bool, reps: int | None) -> list[Job]:
    """One process per row: this script's `--row NAME`, or `bench_live.py --gpu` for the live
    trainer, each under its `LIMITS`."""
    here = Path(__file__).resolve()
    flags = [*(["--tiny"] if tiny else []), *([] if reps is None else ["--reps", str(reps)])]
    return [
        Job(name, python(str(here.parent / "bench_live.py"), "--gpu"), LIMITS[name])
        if name == LIVE
        else Job(name, python(str(here), "--row", name, *flags), LIMITS[name])
        for name in names
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tiny", action="store_true", help="tiny shapes (runs on the CPU too)")
    parser.add_argument("--reps", type=int, help="timed repetitions of every row (default: REPS)")
    parser.add_argument("--only", help="comma-separated row names to run (default: all)")
    parser.add_argument("--budget", type=float, default=BUDGET_S, help="seconds for all the rows")
    parser.add_argument(
        "--in-process",
        action="store_true",
        help="run the rows one after the other in this process, without limits",
    )
    parser.add_argument("--row", help=argparse.SUPPRESS)  # one row, in a process of its own
    args = parser.parse_args(argv)
    if not torch.cuda.is_available() and not args.tiny:
        print("skipped: no CUDA")
        return 0
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    planned = {row.name: (row, shape, measure) for row, shape, measure in plan_rows(args.tiny)}
    known = [*planned, LIVE]
    names = known if args.only is None and args.row is None else (
        [args.row] if args.row is not None else [n.strip() for n in args.only.split(",")]
    )  # fmt: skip
    unknown = [n for n in names if n not in known]
    if unknown:
        print(f"gpu.py: no row named {', '.join(map(repr, unknown))}; rows: {', '.join(known)}",
              file=sys.stderr)  # fmt: skip
        return 2
    if args.tiny and args.only is None:
        names = [n for n in names if n != LIVE]  # the live trainer's row needs a GPU
    reps = lambda n: args.reps or REPS.get(n, 1)  # noqa: E731
    if args.row is not None:  # a child of the runner: its line, then its figures
        row = measured(*planned[args.row], device, args.tiny, reps(args.row), {})
        print(f"RESULT {json.dumps({**vars(row), 'met': row.met})}", flush=True)
        return 1 if row.error else 0
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor()
    print(f"device: {name}; torch {torch.__version__}, transformers {transformers.__version__}"
          f"{' (tiny shapes)' if args.tiny else ''}")  # fmt: skip
    if args.in_process:
        print(HEADER, flush=True)
        models: dict = {}
        rows = [measured(*planned[n], device, args.tiny, reps(n), models) for n in names
                if n != LIVE]  # fmt: skip
    else:
        # Each row is printed as soon as it is measured, so a run stopped by the loan's end
        # keeps the rows it finished.
        outcomes = run_jobs(jobs(names, args.tiny, args.reps), args.budget)
        rows = [row_of(outcome, planned) for outcome in outcomes]
        print(HEADER)
        for row in rows:
            print(row_line(row))
    print(json.dumps({
        "device": name, "torch": torch.__version__, "transformers": transformers.__version__,
        "tiny": args.tiny, "rows": [{**vars(r), "met": r.met} for r in rows],
    }))  # fmt: skip
    return 1 if any(r.error for r in rows) else 0


def row_of(outcome, planned: dict) -> Row:
    """The row a job's outcome stands for: its `RESULT` figures, or why it has none."""
    if outcome.result is not None:
        return Row(**{k: v for k, v in outcome.result.items() if k != "met"})
    template = planned[outcome.name][0] if outcome.name in planned else Row(outcome.name, "-")
    if outcome.name == LIVE and outcome.status == "done":
        template.detail = f"{outcome.line()}; its output above"
        return template
    template.error = outcome.line()
    return template


if __name__ == "__main__":
    raise SystemExit(main())
