"""Forward mode's host work per direction, measured on the CPU for a GPU row's plan (issue 48).

    python bench/bench_host.py                          # T = 2,048's plans: H100, H200, before
    python bench/bench_host.py --plan 4x4               # 4 directions a call, 4 query chunks
    python bench/bench_host.py --quick                  # one repetition, k = 8

On a GPU forward mode is bound by its host: each vmapped jvp call costs the host its Python, its
dispatch and functorch's bookkeeping whatever the call's size, and each query chunk of each layer
adds its share (bench/README.md, issue 48). This measures that work where it can be measured
without a GPU: a Qwen2 with Qwen2.5-1.5B's depth (28 layers) and heads (12, 2 key/value) but a
width of 24 and 256 tokens, one response of 8 tokens after an 8-token prompt, so that the
arithmetic is negligible; the attention's scores per chunk are set so that each layer runs the
plan's number of query chunks. Per plan (`DxC`: D directions a call, C query chunks a layer):
the process's CPU seconds per direction (best of `--reps` passes of k directions) and the Python
function calls per direction (cProfile, one pass: the same on every machine). The default plans
are the T = 2,048 row's, computed by `cost.forward_layout` for the real shape (H100: 8 × 1, H200:
16 × 1) and the plan before issue 48 (4 × 4; run it with `PYTHONPATH` at an older tree to time
that tree's code). Output: a table, then one JSON line.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import pstats
import time

import torch
from bench_full import responses
from transformers import Qwen2Config, Qwen2ForCausalLM

from otb_diag.policy.scores.directions import Block, select_parameters
from otb_diag.policy.scores.forward_mode import forward_scores

PROMPT_AND_RESPONSE = 16  # bench_full's 8-token prompt, then 8 tokens
PLANS = {"H100 (issue 48)": (8, 1), "H200 (issue 48)": (16, 1), "before (5e2c880)": (4, 4)}


def model() -> Qwen2ForCausalLM:
    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=256, hidden_size=24, intermediate_size=32, num_hidden_layers=28,
        num_attention_heads=12, num_key_value_heads=2, tie_word_embeddings=True,
    )  # fmt: skip
    return Qwen2ForCausalLM(config).eval()


def measure(lm, directions: int, chunks: int, k: int, reps: int) -> dict:
    """CPU seconds and Python calls per direction of one pass of k directions."""
    params = select_parameters(lm, None)
    batch = responses(lm.config.vocab_size, 1, PROMPT_AND_RESPONSE // 2)
    rows = -(-PROMPT_AND_RESPONSE // chunks)  # query rows a chunk
    scores = lm.config.num_attention_heads * PROMPT_AND_RESPONSE * rows

    def run() -> None:
        blocks = [Block("all", tuple(params), k, 0)]
        forward_scores(
            lm, batch, params, blocks, 0, batch_tokens=4096, directions_batch=directions,
            attention_scores=scores,
        )  # fmt: skip

    run()  # first-call costs
    seconds = []
    for _ in range(reps):
        t0 = time.process_time()
        run()
        seconds.append(time.process_time() - t0)
    profile = cProfile.Profile()
    profile.enable()
    run()
    profile.disable()
    calls = pstats.Stats(profile).total_calls
    return {
        "directions_per_call": directions, "query_chunks": chunks, "calls": -(-k // directions),
        "cpu_s_per_direction": min(seconds) / k, "python_calls_per_direction": calls / k,
    }  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--plan", action="append", help="DxC: directions a call x query chunks")
    parser.add_argument("--k", type=int, default=32, help="directions of a pass")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="k = 8, one repetition")
    args = parser.parse_args(argv)
    k, reps = (8, 1) if args.quick else (args.k, args.reps)
    torch.set_num_threads(1)
    plans = (
        {p: tuple(int(x) for x in p.split("x")) for p in args.plan} if args.plan else PLANS
    )  # fmt: skip
    lm = model()
    rows = {}
    print(f"{'plan':<18} {'D x C':>7} {'calls':>6} {'CPU ms/dir':>11} {'Python calls/dir':>17}")
    for name, (directions, chunks) in plans.items():
        r = rows[name] = measure(lm, directions, chunks, k, reps)
        print(f"{name:<18} {directions:>3} x {chunks:<2} {r['calls']:>6} "
              f"{r['cpu_s_per_direction'] * 1e3:>11.1f} {r['python_calls_per_direction']:>17,.0f}",
              flush=True)  # fmt: skip
    print(json.dumps({"k": k, "reps": reps, "torch": torch.__version__, "plans": rows}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
