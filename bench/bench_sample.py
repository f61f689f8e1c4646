"""Cost of `rollouts sample`'s sampler against a bare `model.generate`, as ratios within one run.

    python bench/bench_sample.py [--gguf PATH_TO_SmolLM2.gguf] [--rows 64,512] [--new 64] [--reps 3]

Throughput: generated tokens per second of `otb_diag.policy.sampling.sample_batch` (per-row
Gumbel-max from the counter-based hash noise inside `generate`, `logprobs` and `sum_pi2`
recorded every step) against a bare `model.generate(do_sample=True, temperature=τ, top_k=0,
top_p=1)` on the same left-padded batch, same model, both under `torch.no_grad()`, EOS disabled
so both generate exactly `--new` tokens per row; one warm-up each, then alternated, median of
`--reps` (the ratio: the median of the repetitions' paired ratios); at every batch size of
`--rows`. Memory: the growth of the peak resident set (`VmHWM` after a reset) over the resident
set once model and inputs are ready, each path in a fresh subprocess. On the embedded toy model,
and on SmolLM2-135M-Instruct with `--gguf`. Prints a table, then one JSON line with every number.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch
from threads import add_threads, pin_threads

from otb_diag.io.checkpoint import load_checkpoint
from otb_diag.io.scenarios import default_checkpoint
from otb_diag.policy.noise import RowNoise
from otb_diag.policy.sampling import Sampling, row_seed, sample_batch

TAU = 1.0
THROUGHPUT_TARGET = 0.9  # sampler tokens/s / bare generate tokens/s
MEMORY_TARGET = 1.1  # peak extra RSS, sampler / bare generate


def _setup(model_name: str, gguf: str | None, rows: int):
    ckpt = load_checkpoint(
        gguf if model_name == "smollm2" else default_checkpoint("default"), dtype="float32"
    )
    tok = ckpt.tokenizer
    texts = ["What is 7 + 5?", "Name a colour.", "C:684=", "R:096="]
    prompts = [tok(texts[i % len(texts)])["input_ids"] for i in range(rows)]
    no_eos = ckpt.vocab_size + 7  # an id the model can never produce: every row runs to --new
    return ckpt, prompts, no_eos


def _bare(model, prompts, new: int, no_eos: int, pad: int) -> int:
    width = max(len(p) for p in prompts)
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    from transformers import GenerationConfig

    config = GenerationConfig(
        do_sample=True,
        temperature=TAU,
        top_k=0,
        top_p=1.0,
        max_new_tokens=new,
        min_new_tokens=new,
        eos_token_id=no_eos,
        pad_token_id=pad,
    )
    with torch.no_grad():
        out = model.generate(input_ids=ids, attention_mask=mask, generation_config=config)
    return (out.shape[1] - width) * len(prompts)


def _ours(model, prompts, new: int, no_eos: int, pad: int) -> int:
    samples = sample_batch(
        model,
        prompts,
        RowNoise([row_seed(0, i, 0) for i in range(len(prompts))]),
        Sampling(TAU, 0, 1.0, new),
        eos_ids=[no_eos],
        pad_id=pad,
    )
    return sum(len(s.response_ids) for s in samples)


PATHS = {"bare": _bare, "ours": _ours}


def _kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(field)


def _peak_child(path: str, args, rows: int) -> float:
    """MiB by which a fresh process's peak RSS grows over its RSS once model and inputs are
    ready, running `path` once."""
    cmd = [
        sys.executable,
        __file__,
        "--_memory",
        path,
        "--model",
        args.model,
        "--rows",
        str(rows),
        "--new",
        str(args.new),
    ] + (["--gguf", args.gguf] if args.gguf else [])
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    return float(out.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", choices=["embedded", "smollm2"], default=None)
    parser.add_argument(
        "--gguf", help="SmolLM2-135M-Instruct .gguf (tests/real_model.py caches one)"
    )
    parser.add_argument("--rows", default="64,512", help="batch sizes, comma-separated")
    parser.add_argument("--new", type=int, default=64)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--_memory", choices=list(PATHS), help=argparse.SUPPRESS)
    add_threads(parser, 1)
    args = parser.parse_args()
    threads = pin_threads(args.threads)  # the memory children inherit it
    models = [args.model] if args.model else ["embedded"] + (["smollm2"] if args.gguf else [])
    if args._memory:
        ckpt, prompts, no_eos = _setup(args.model, args.gguf, int(args.rows))
        pad = ckpt.tokenizer.pad_token_id or 0
        Path("/proc/self/clear_refs").write_text("5")  # reset VmHWM to the current RSS
        base = _kib("VmRSS")
        PATHS[args._memory](ckpt.model, prompts, args.new, no_eos, pad)
        print((_kib("VmHWM") - base) / 1024)
        return
    results = []
    for name, rows in [(m, int(r)) for m in models for r in str(args.rows).split(",")]:
        args.model = name
        ckpt, prompts, no_eos = _setup(name, args.gguf, rows)
        pad = ckpt.tokenizer.pad_token_id or 0
        times: dict[str, list[float]] = {"bare": [], "ours": []}
        tokens = {}
        for rep in range(args.reps + 1):
            for path, fn in PATHS.items():
                start = time.perf_counter()
                tokens[path] = fn(ckpt.model, prompts, args.new, no_eos, pad)
                if rep:  # rep 0 warms up
                    times[path].append(time.perf_counter() - start)
        rate = {p: tokens[p] / statistics.median(times[p]) for p in PATHS}
        peak = {p: _peak_child(p, args, rows) for p in PATHS}
        results.append(
            {
                "model": name,
                "rows": rows,
                "new_tokens": args.new,
                "tok_s_bare": rate["bare"],
                "tok_s_ours": rate["ours"],
                # Paired: each repetition's ratio, bare and ours back to back, then the median,
                # so a change of the machine's load between repetitions cancels.
                "throughput_ratio": statistics.median(
                    tokens["ours"] / ours * bare / tokens["bare"]
                    for bare, ours in zip(times["bare"], times["ours"], strict=True)
                ),
                "peak_mib_bare": peak["bare"],
                "peak_mib_ours": peak["ours"],
                "memory_ratio": peak["ours"] / peak["bare"],
            }
        )
    print(f"torch {torch.__version__}; {threads}")
    print(
        f"{'model':10} {'rows':>5} {'bare tok/s':>10} {'ours tok/s':>10} {'ratio':>6} {'target':>7}"
        f" {'bare MiB':>9} {'ours MiB':>9} {'ratio':>6} {'target':>7}"
    )
    for r in results:
        print(
            f"{r['model']:10} {r['rows']:5} {r['tok_s_bare']:10.0f} {r['tok_s_ours']:10.0f}"
            f" {r['throughput_ratio']:6.3f} {'≥ ' + str(THROUGHPUT_TARGET):>7}"
            f" {r['peak_mib_bare']:9.1f} {r['peak_mib_ours']:9.1f} {r['memory_ratio']:6.3f}"
            f" {'≤ ' + str(MEMORY_TARGET):>7}"
        )
    print(json.dumps(results))


if __name__ == "__main__":
    main()
