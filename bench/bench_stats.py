"""Cost of the per-token statistics pass, measured as ratios within one run of this script.

    python bench/bench_stats.py [--quick]

Time: the statistics pass (`stats_for_sequences`, exactly what `otb-diag energy` runs, default
chunk size) against a bare forward that computes only the sampled tokens' log-probs the usual way
(`model(...).logits` -> fp32 `log_softmax` -> gather), same model, same batches, both under
`torch.no_grad()`, back to back in pairs whose first run alternates, after a warm-up; the
ratio is the median of the pairs' ratios, the times the medians. On the embedded toy model
with its default rollouts, and on a ~50 M-parameter GPT-2-style model (random, seeded) at T = 1024.

Memory: peak extra RSS of the statistics pass against the naive logits path at T = 4096 and a
152k vocabulary, each in a fresh subprocess (see `_peak_extra_rss`).

Prints a table, then one JSON line with every number.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from threads import add_threads, pin_threads
from torch import Tensor, nn
from transformers import GPT2Config, GPT2LMHeadModel

from otb_diag.io.checkpoint import load_checkpoint
from otb_diag.io.loading import load_rollouts
from otb_diag.io.scenarios import DEFAULT_ROLLOUTS, default_checkpoint
from otb_diag.policy.forward_pass import pack_by_tokens, pad_batch, stats_for_sequences

TIME_TARGET = 1.15  # statistics pass / bare forward, on CPU
MEMORY_TARGET = 0.25  # peak extra RSS, statistics pass / naive logits path

# The batch size `stats_for_sequences` uses by default; the bare forward packs rows the same way.
BATCH_TOKENS = 16384

Rows = tuple[list[list[int]], list[list[int]]]  # (prompts, responses) as token-id lists


@dataclass
class TimeResult:
    case: str
    stats_s: float  # median seconds of one statistics pass over all rows
    bare_s: float  # median seconds of one bare forward over the same rows
    ratio: float
    passed: bool


@dataclass
class MemoryResult:
    case: str
    stats_mib: float  # peak RSS increase of the statistics pass
    naive_mib: float  # peak RSS increase of the naive logits path
    ratio: float
    passed: bool


def bare_logprobs(model: nn.Module, batches: Sequence[tuple[Tensor, Tensor]]) -> list[Tensor]:
    """The usual way: full logits, fp32 log-softmax, gather the next token; `[B, L−1]` per batch.

    batches: `(input_ids [B, L], attention_mask [B, L])` pairs, right-padded.
    """
    out = []
    for ids, mask in batches:
        logits = model(input_ids=ids, attention_mask=mask).logits  # [B, L, V]
        logp = torch.log_softmax(logits.float(), dim=-1)
        out.append(logp[:, :-1].gather(-1, ids[:, 1:, None])[..., 0])
    return out


def time_case(case: str, model: nn.Module, rows: Rows, reps: int) -> TimeResult:
    """Median time of the statistics pass and of the bare forward, alternated after a warm-up."""
    prompts, responses = rows
    lengths = [len(p) + len(r) for p, r in zip(prompts, responses, strict=True)]
    batches = []
    for batch in pack_by_tokens(lengths, BATCH_TOKENS):
        ids, mask, _ = pad_batch([prompts[i] for i in batch], [responses[i] for i in batch])
        batches.append((ids, mask))

    runs: dict[str, Callable[[], object]] = {
        "stats": lambda: stats_for_sequences(model, prompts, responses),
        "bare": lambda: bare_logprobs(model, batches),
    }
    times: dict[str, list[float]] = {name: [] for name in runs}
    with torch.no_grad():
        for run in runs.values():  # warm-up: allocator, thread pool, one-off dispatch
            run()
        for rep in range(reps):
            # Back to back, the first of each pair alternating: a drift of the machine (frequency,
            # neighbours) hits both runs of a pair alike, and neither is always first.
            for name in list(runs)[:: 1 if rep % 2 == 0 else -1]:
                start = time.perf_counter()
                runs[name]()
                times[name].append(time.perf_counter() - start)
    stats_s, bare_s = statistics.median(times["stats"]), statistics.median(times["bare"])
    # The median of the pairs' ratios: single runs of the same code spread by ±30 % here.
    ratio = statistics.median(a / b for a, b in zip(times["stats"], times["bare"], strict=True))
    return TimeResult(case, stats_s, bare_s, ratio, ratio <= TIME_TARGET)


def toy_case(reps: int, rows: int | None = None) -> TimeResult:
    """The embedded default: its final checkpoint and the rollouts sampled from it (the first
    `rows` of them, where given)."""
    model = load_checkpoint(default_checkpoint(), dtype="float32").model
    rollouts = load_rollouts(DEFAULT_ROLLOUTS).responses[:rows]
    rows = ([r.prompt_ids for r in rollouts], [r.response_ids for r in rollouts])
    n_params = sum(p.numel() for p in model.parameters())
    n_tokens = sum(len(r) for r in rows[1])
    case = f"toy default ({n_params / 1e6:.2f} M params, {len(rollouts)} rows, {n_tokens} tokens)"
    return time_case(case, model, rows, reps)


def random_gpt2(config: GPT2Config, seed: int = 0) -> GPT2LMHeadModel:
    torch.manual_seed(seed)
    return GPT2LMHeadModel(config).eval()


def random_rows(n_rows: int, prompt_len: int, response_len: int, vocab: int, seed: int) -> Rows:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(vocab, (n_rows, prompt_len + response_len), generator=g).tolist()
    return [r[:prompt_len] for r in ids], [r[prompt_len:] for r in ids]


def gpt2_50m_case(reps: int, response_len: int) -> TimeResult:
    """GPT-2-style, 50257 vocabulary, untied head: ~50 M parameters, 2 rows of 64 + response."""
    config = GPT2Config(
        vocab_size=50257, n_embd=384, n_layer=6, n_head=6, n_positions=1024,
        tie_word_embeddings=False,
    )  # fmt: skip
    model = random_gpt2(config)
    n_params = sum(p.numel() for p in model.parameters())
    T = 64 + response_len
    case = f"gpt2 random ({n_params / 1e6:.1f} M params, 2 rows, T = {T})"
    return time_case(case, model, random_rows(2, 64, response_len, config.vocab_size, 1), reps)


def _memory_config(n_positions: int) -> GPT2Config:
    return GPT2Config(
        vocab_size=152064, n_embd=64, n_layer=1, n_head=2, n_positions=n_positions,
        tie_word_embeddings=False,
    )  # fmt: skip


def _rss_kib(field: str) -> int:
    """`VmRSS` (now) or `VmHWM` (peak since the last reset) of this process, in KiB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


def _peak_extra_rss(path: str, response_len: int) -> float:
    """MiB by which this process's peak RSS grows over its RSS once model and inputs are ready.

    Run in a fresh subprocess per path. `ru_maxrss` is not used: after `exec` the kernel carries
    the parent's peak RSS into the child's `ru_maxrss` (a large parent hides the child's peak).
    The per-process `VmHWM` is reset to the current RSS instead (`clear_refs`, value 5).
    """
    config = _memory_config(64 + response_len)
    model = random_gpt2(config)
    prompts, responses = random_rows(1, 64, response_len, config.vocab_size, 2)
    ids, mask, _ = pad_batch(prompts, responses)
    gc.collect()
    Path("/proc/self/clear_refs").write_text("5")
    ready = _rss_kib("VmRSS")
    with torch.no_grad():
        if path == "stats":
            stats_for_sequences(model, prompts, responses)
        else:
            bare_logprobs(model, [(ids, mask)])
    return (_rss_kib("VmHWM") - ready) / 1024


def memory_case(response_len: int) -> MemoryResult:
    peaks = {}
    for path in ("stats", "naive"):
        cmd = [sys.executable, __file__, "--_memory", path, "--_response-len", str(response_len)]
        out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
        peaks[path] = float(out.strip().splitlines()[-1])
    ratio = peaks["stats"] / peaks["naive"]
    case = f"peak extra RSS (V = 152064, T = {64 + response_len}, 1 row)"
    return MemoryResult(case, peaks["stats"], peaks["naive"], ratio, ratio <= MEMORY_TARGET)


def machine(load_before: float) -> dict[str, object]:
    """What the numbers depend on. A load average above the core count means other processes
    competed for the cores during the run, which slows many-op passes most: treat ratios with care.
    """
    return {
        "cpu_cores": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "python": sys.version.split()[0],
        "load_avg_1min_before": load_before,
        "load_avg_1min_after": os.getloadavg()[0],
    }


def print_report(
    times: list[TimeResult], memory: MemoryResult, quick: bool, load_before: float
) -> None:
    info = machine(load_before)
    print(
        f"machine: {info['cpu_cores']} cores, {info['torch_threads']} torch threads, "
        f"torch {info['torch']}, python {info['python']}, 1-min load average "
        f"{load_before:.2f} before, {info['load_avg_1min_after']:.2f} after"
        + (" (--quick)" if quick else "")
    )
    print(f"{'case':<58} {'stats':>10} {'baseline':>10} {'ratio':>6} {'target':>7}  result")
    for r in times:
        mark = "PASS" if r.passed else "FAIL"
        print(
            f"{r.case:<58} {r.stats_s:>9.3f}s {r.bare_s:>9.3f}s {r.ratio:>6.3f} "
            f"{'≤ ' + str(TIME_TARGET):>7}  {mark}"
        )
    mark = "PASS" if memory.passed else "FAIL"
    print(
        f"{memory.case:<58} {memory.stats_mib:>7.0f}MiB {memory.naive_mib:>7.0f}MiB "
        f"{memory.ratio:>6.3f} {'≤ ' + str(MEMORY_TARGET):>7}  {mark}"
    )
    print("(time baseline: bare forward, model(...).logits -> log_softmax -> gather; "
          "memory baseline: the same naive path)")  # fmt: skip
    record = {
        "machine": info,
        "quick": quick,
        "time": [asdict(r) for r in times],
        "memory": asdict(memory),
        "all_passed": all(r.passed for r in times) and memory.passed,
    }
    print(json.dumps(record))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer repetitions, shorter rows")
    parser.add_argument(
        "--tiny", action="store_true", help="smallest path (tests/bench/): 1 rep, 32 toy rows"
    )
    parser.add_argument("--_memory", choices=["stats", "naive"], help=argparse.SUPPRESS)
    parser.add_argument("--_response-len", type=int, help=argparse.SUPPRESS)
    add_threads(parser, 1)
    args = parser.parse_args()
    threads = pin_threads(args.threads)  # the memory subprocesses inherit it
    if args._memory is not None:  # the subprocess of `memory_case`
        print(_peak_extra_rss(args._memory, args._response_len))
        return
    print(threads)
    load_before = os.getloadavg()[0]
    reps = 1 if args.tiny else 7 if args.quick else 15
    response_len = 64 if args.tiny else 448 if args.quick else 960
    times = [toy_case(reps, 32 if args.tiny else None), gpt2_50m_case(reps, response_len)]
    memory = memory_case(64 if args.tiny else 1984 if args.quick else 4032)
    print_report(times, memory, args.quick, load_before)


if __name__ == "__main__":
    main()
