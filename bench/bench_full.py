"""Cost of `full` mode's two engines on random GPT-2-style models, measured in one run.

For models of ~5 M, ~25 M and ~100 M parameters and one response of T ∈ {256, 2048} tokens
(`--quick`: the ~5 M model at T = 256 only):
- forward mode (jvp): seconds per response and direction, and that ÷ a bare forward (target ≤ 3),
  with the query-chunked attention the engine uses and, in the same run, with eager attention;
  and the cost model's estimate of that pass (`plan_full`, its calibration included) ÷ the
  measured time (target: within 2× either way, so `--budget` refuses only what would not fit);
- reverse mode (vjp, k directions): seconds per response, measured on the first `--prefix`
  tokens and extrapolated to T by the cost model's `Σ_t L_t` (marked "extrapolated");
- peak resident memory of a forward-mode pass (each attention) ÷ a bare forward's (target ≤ 3),
  each in a fresh subprocess (`VmHWM` reset after a first call on 8 tokens);
- the crossover T above which forward mode wins for k directions, from the two measured T
  (forward ∝ T, reverse = b T² + c T).
`--e2e`: `token_scores(engine="auto")` on a ~25 M model, 32 responses of T = 512, k = 32.
`--jl-seeds S`: the projection error on the embedded default: full-mode variances at N = 4
(token-sum, same draws) under S projection seeds, their relative spread for `mean`, `otb` and
the ratio OTB/mean, beside √(2/k) and the sub-sketch estimate the summary prints.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

import torch
from bench_stats import _rss_kib
from threads import add_threads, pin_threads
from transformers import GPT2Config, GPT2LMHeadModel

from otb_diag.maths.response_batch import ResponseBatch, pad
from otb_diag.policy.scores.chunked_attention import NAME
from otb_diag.policy.scores.cost import _prefix_work, _sub_batch, plan_full
from otb_diag.policy.scores.directions import Block, select_parameters
from otb_diag.policy.scores.forward_mode import eager_attention, forward_scores
from otb_diag.policy.scores.reverse_mode import _Columns, reverse_scores
from otb_diag.policy.scores.token_scores import token_scores

MODELS = {"5M": (256, 4, 4096), "25M": (512, 6, 4096), "100M": (768, 12, 8192)}  # d, layers, V
PROMPT = 8
CPU_TARGET = 2.5  # jvp seconds per direction ÷ a bare forward, on CPU (issue 25)
REVERSE_BYTES = 4 << 30  # gradients held by reverse mode (32 tokens of a 100 M model: 37 GiB)


def model_of(name: str, positions: int, vocab: int | None = None) -> GPT2LMHeadModel:
    d, layers, default_vocab = MODELS[name]
    vocab = vocab or default_vocab
    torch.manual_seed(0)
    config = GPT2Config(vocab_size=vocab, n_embd=d, n_layer=layers, n_head=d // 64,
                        n_positions=positions, tie_word_embeddings=False)  # fmt: skip
    return GPT2LMHeadModel(config).eval()


def responses(vocab: int, rows: int, length: int) -> ResponseBatch:
    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(0, vocab, (rows, PROMPT + length), generator=gen)
    length_t = torch.full((rows,), length)
    valid = torch.ones(rows, length, dtype=torch.bool)
    zeros = torch.zeros(rows, length)
    return ResponseBatch(
        group_names=[str(i // 8) for i in range(rows)], group=torch.arange(rows) // 8,
        sample=torch.arange(rows), length=length_t, prompt_ids=ids[:, :PROMPT].tolist(),
        response_ids=pad(ids[:, PROMPT:].tolist(), length, 0, torch.long), valid=valid,
        mask=valid.float(), token_rewards=zeros, reward=torch.zeros(rows),
        temperature=torch.ones(rows), step=[None] * rows, is_weights=None, logprobs=None,
        sum_pi2=None,
    )  # fmt: skip


def timed(fn) -> float:
    return wall_and_cpu(fn)[0]


def wall_and_cpu(fn) -> tuple[float, float]:
    """Wall seconds of `fn()` and this process's CPU seconds in it (all threads): on a loaded
    machine the second ratio is the steadier one, as waiting for a core is not counted."""
    wall, cpu = time.perf_counter(), time.process_time()
    fn()
    return time.perf_counter() - wall, time.process_time() - cpu


def bare_forward(model, batch) -> None:
    ids = torch.tensor([batch.prompt_ids[0] + batch.response_ids[0].tolist()])
    with torch.no_grad(), eager_attention(model):
        model(ids, use_cache=False)


def jvp_pass(model, batch, directions: int, attention: str = NAME) -> None:
    params = select_parameters(model, None)
    blocks = [Block("all", tuple(params), directions, 0)]
    forward_scores(model, batch, params, blocks, 0, batch_tokens=1 << 20,
                   directions_batch=directions,
                   attention=attention)  # fmt: skip


def memory_child(name: str, length: int, what: str, vocab: int) -> None:
    model = model_of(name, PROMPT + length, vocab)
    batch = responses(vocab, 1, length)

    def run(b: ResponseBatch) -> None:
        bare_forward(model, b) if what == "bare" else jvp_pass(model, b, 1, what)

    run(_sub_batch(batch, [0], 8))  # first-call costs (lazy imports), as a real run's calibration
    ready = _rss_kib("VmRSS")
    Path("/proc/self/clear_refs").write_text("5")
    run(batch)
    print(json.dumps({"peak_extra_mib": (_rss_kib("VmHWM") - ready) / 1024}))


def peak(name: str, length: int, what: str, vocab: int) -> float:
    cmd = [sys.executable, __file__, "--_memory", f"{name},{length},{what},{vocab}"]
    return json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)[
        "peak_extra_mib"
    ]


def measure(
    name: str, length: int, k: int, prefix: int, directions: int, vocab: int | None, jvp_only: bool
) -> dict:
    model = model_of(name, PROMPT + length, vocab)
    vocab = model.config.vocab_size
    batch = responses(vocab, 1, length)
    bare_forward(model, batch)  # warm-up
    bare, bare_cpu = min(wall_and_cpu(lambda: bare_forward(model, batch)) for _ in range(2))
    jvp_pass(model, _sub_batch(batch, [0], 8), directions)  # warm-up
    jvp, jvp_cpu = (
        x / directions for x in wall_and_cpu(lambda: jvp_pass(model, batch, directions))
    )
    params = select_parameters(model, None)
    one_pass = [Block("all", tuple(params), directions, 0)]  # what jvp_pass runs
    estimate = plan_full(model, batch, params, one_pass, 0, engine="jvp", budget_s=None).forward_s
    head = {"model": name, "params": sum(p.numel() for p in model.parameters()), "V": vocab,
            "T": length, "bare_forward_s": bare, "jvp_s_per_direction": jvp,
            "jvp_over_bare": jvp / bare, "jvp_over_bare_cpu": jvp_cpu / bare_cpu,
            "estimate_over_measured": estimate / (jvp * directions)}  # fmt: skip
    if jvp_only:
        return head
    eager = timed(lambda: jvp_pass(model, batch, directions, "eager")) / directions
    bare_rss = max(peak(name, length, "bare", vocab), 1e-9)
    cut = _sub_batch(batch, [0], prefix)
    blocks = [Block("all", tuple(params), k, 0)]
    # the direction columns are drawn once per run: timed apart, not extrapolated
    draw = timed(lambda: _Columns(params, blocks, 0, torch.device("cpu")))
    n = sum(p.numel() for p in params.values())
    chunk = max(1, min(32, REVERSE_BYTES // (12 * n)))  # ≈ 12 bytes per parameter and token
    rev_prefix = timed(lambda: reverse_scores(model, cut, params, blocks, 0, chunk)) - draw
    rows, cut_rows = [(PROMPT, length)], [(PROMPT, min(prefix, length))]
    scale = _prefix_work(rows, 32) / _prefix_work(cut_rows, 32)
    return {
        **head, "vjp_s": draw + rev_prefix * scale, "vjp_extrapolated": prefix < length,
        "rss_ratio": peak(name, length, NAME, vocab) / bare_rss,
        "eager_jvp_s_per_direction": eager, "eager_over_bare": eager / bare,
        "eager_rss_ratio": peak(name, length, "eager", vocab) / bare_rss,
    }  # fmt: skip


def crossover(a: dict, b: dict, k: int) -> float:
    """T at which k jvp passes cost as much as reverse mode (module docstring)."""
    alpha = (a["jvp_s_per_direction"] / a["T"] + b["jvp_s_per_direction"] / b["T"]) / 2
    (t1, r1), (t2, r2) = (a["T"], a["vjp_s"]), (b["T"], b["vjp_s"])
    bq = (r2 / t2 - r1 / t1) / (t2 - t1)  # r/T = b T + c
    c = r1 / t1 - bq * t1
    return (k * alpha - c) / bq if bq > 0 else float("nan")


def end_to_end(k: int) -> dict:
    model = model_of("25M", PROMPT + 512)
    batch = responses(MODELS["25M"][2], 32, 512)
    plans = []
    seconds = timed(lambda: token_scores(model, batch, "full", k, 0, on_plan=plans.append))
    return {"e2e_s": seconds, "engine": plans[0].engine, "estimate_s": plans[0].estimate_s}


def describe(r: dict, k: int) -> str:
    def verdict(x: float, target: float = 3) -> str:
        return "PASS" if x <= target else "FAIL"

    def within(ratio: float) -> str:  # `--budget` honest: the estimate within 2x either way
        return "PASS" if 0.5 <= ratio <= 2 else "FAIL"

    head = (
        f"{r['model']:>5} ({r['params'] / 1e6:.1f} M, V={r['V']}) T={r['T']:>5}: jvp "
        f"{r['jvp_s_per_direction']:.3f} s/direction, bare forward {r['bare_forward_s']:.3f} s: "
        f"jvp_over_bare {r['jvp_over_bare']:.2f} [{verdict(r['jvp_over_bare'], CPU_TARGET)} <= "
        f"{CPU_TARGET}] (in CPU seconds: {r['jvp_over_bare_cpu']:.2f}); cost model "
        f"{r['estimate_over_measured']:.2f} x measured [{within(r['estimate_over_measured'])} "
        "within 2x]"
    )
    if "vjp_s" not in r:
        return head
    extrapolated = " (extrapolated)" if r["vjp_extrapolated"] else ""
    return (
        f"{head}; vjp (k={k}) {r['vjp_s']:.1f} s{extrapolated}; "
        f"peak RSS {r['rss_ratio']:.2f} x bare [{verdict(r['rss_ratio'])} <= 3]; eager "
        f"attention instead: {r['eager_over_bare']:.2f} x, peak RSS {r['eager_rss_ratio']:.2f} x"
    )


def jl_seeds(seeds: int, k: int) -> dict:
    import numpy as np

    from otb_diag.io.batches import checkpoint_batch
    from otb_diag.io.loading import LoadOptions, load_rollouts
    from otb_diag.io.scenarios import DEFAULT_ROLLOUTS, default_checkpoint
    from otb_diag.maths.returns import returns_to_go
    from otb_diag.maths.variance.blocks import projection_error
    from otb_diag.maths.variance.paired_draws import paired_estimates, variance_table

    ckpt, batch, _ = checkpoint_batch(
        default_checkpoint(), load_rollouts(DEFAULT_ROLLOUTS), LoadOptions()
    )
    returns = returns_to_go(batch.token_rewards, batch.mask)
    values, sub = [], None
    for seed in range(seeds):
        scores = token_scores(ckpt.model, batch, "full", k, seed, engine="vjp")
        paired = paired_estimates(
            returns, batch.mask, batch.group, scores.proj, {"proxy": scores.sq_norm},
            aggregations=("token-sum",), group_sizes=(4,), draws=200, bootstrap=10, seed=0,
        )  # fmt: skip
        table = variance_table(paired).set_index("baseline")["variance"]
        values.append([table["mean"], table["otb"], table["otb"] / table["mean"]])
        sub = sub or projection_error(paired, scores.blocks)
    v = np.array(values)
    spread = v.std(0, ddof=1) / v.mean(0)
    return {"k": k, "seeds": seeds, "theory": (2 / k) ** 0.5, "mean_rel_err": spread[0],
            "otb_rel_err": spread[1], "ratio_rel_err": spread[2], "subsketch": sub}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--e2e", action="store_true", help="the 25 M end-to-end run")
    parser.add_argument("--k", type=int, default=32, help="directions for reverse mode")
    parser.add_argument("--prefix", type=int, default=64, help="reverse-mode tokens measured")
    parser.add_argument("--directions", type=int, default=4, help="directions per jvp (vmap)")
    parser.add_argument("--jl-seeds", type=int, default=0, help="projection seeds (default)")
    parser.add_argument("--models", default=",".join(MODELS), help="subset of 5M,25M,100M")
    parser.add_argument("--lengths", default="256,2048", help="response lengths T")
    parser.add_argument("--vocab", type=int, help="vocabulary V of every model (default: its own)")
    parser.add_argument(
        "--jvp-only",
        action="store_true",
        help="only jvp_over_bare: no reverse mode, eager attention or memory",
    )
    parser.add_argument("--_memory", help=argparse.SUPPRESS)
    add_threads(parser, 2)
    args = parser.parse_args()
    threads = pin_threads(args.threads)  # the memory children inherit it
    if args._memory:
        name, length, what, vocab = args._memory.split(",")
        return memory_child(name, int(length), what, int(vocab))
    print(f"machine: torch {torch.__version__}, {platform.python_version()}, load average "
          f"{os.getloadavg()}; {threads}")  # fmt: skip
    chosen = args.models.split(",")
    lengths = tuple(int(t) for t in args.lengths.split(","))
    cases = [("5M", (256,))] if args.quick else [(m, lengths) for m in chosen if m]
    rows = []
    for name, lengths in cases:
        per_model = [
            measure(name, t, args.k, args.prefix, args.directions, args.vocab, args.jvp_only)
            for t in lengths
        ]
        for r in per_model:
            print(describe(r, args.k))
        if len(per_model) == 2 and not args.jvp_only:
            t_star = crossover(*per_model, args.k)
            where = (
                f"above T ≈ {t_star:.0f}"
                if t_star > 0
                else "at every T (reverse mode's per-token cost alone exceeds k passes' share)"
            )
            print(f"{name}: forward mode wins {where} for k = {args.k}")
            per_model[-1]["crossover_T"] = t_star
        rows += per_model
    if args.e2e:
        e2e = end_to_end(args.k)
        minutes, estimate = e2e["e2e_s"] / 60, e2e["estimate_s"] / 60
        print(f"end to end: 25 M model, 32 x T=512, k={args.k}: {minutes:.1f} min "
              f"({e2e['engine']}; estimated {estimate:.1f} min) [target <= 20]")  # fmt: skip
        rows.append(e2e)
    if args.jl_seeds:
        jl = jl_seeds(args.jl_seeds, args.k)
        print(f"projection error on the default, k={jl['k']}, {jl['seeds']} seeds: variance of "
              f"mean ±{jl['mean_rel_err']:.1%}, of otb ±{jl['otb_rel_err']:.1%}, OTB/mean "
              f"±{jl['ratio_rel_err']:.1%} (√(2/k) = {jl['theory']:.1%}); sub-sketch estimate "
              f"(seed 0): variances ±{jl['subsketch']['variance_relative_error']:.1%}, ratios "
              f"±{jl['subsketch']['ratio_relative_error']:.1%}")  # fmt: skip
        rows.append(jl)
    print(json.dumps(rows))


if __name__ == "__main__":
    main()
