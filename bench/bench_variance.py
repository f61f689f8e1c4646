"""Speed of `variance-compare` on the embedded default, measured in one run.

- `head` mode token throughput against the `energy` statistics pass (target ≥ 0.5×);
- `full` mode end to end (scores + paired draws, all prompts, N ∈ {2,4,8,16}, R = 200, all three
  aggregations): wall time (target ≤ 120 s on 2 cores);
- rewards without a signal: `otb-diag variance-compare` (its default modes, --draws and
  --sketch-dim as given), each run a fresh process, on the embedded rollouts with every reward
  set to 0.0 against the originals: wall time ratio (target < 0.2: no model is loaded).

`--rollouts` measures another pool instead of the embedded rollouts (the smallest path's test
gives 4 of their 16 groups: the targets are set for the embedded default).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from threads import add_threads, pin_threads

from otb_diag.io.batches import checkpoint_batch
from otb_diag.io.loading import LoadOptions, load_rollouts
from otb_diag.io.scenarios import DEFAULT_ROLLOUTS, default_checkpoint
from otb_diag.maths.returns import returns_to_go
from otb_diag.maths.variance.paired_draws import default_specs, empirical_variance
from otb_diag.policy.forward_pass import checkpoint_stats
from otb_diag.policy.scores.token_scores import token_scores

BIN = "otb_diag"  # `python -m otb_diag`: each command in a fresh process, its imports timed
NO_SIGNAL_TARGET = 0.2


def timed(fn):
    start = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - start


def no_signal_ratio(args: argparse.Namespace) -> tuple[float, float]:
    """Wall seconds of `variance-compare` on the embedded rollouts with every reward 0.0, and on
    the originals, each in a fresh process."""
    seconds = []
    with tempfile.TemporaryDirectory() as tmp:
        flat = Path(tmp) / "no-signal.jsonl"
        rows = [json.loads(line) for line in args.rollouts.read_text().splitlines()]
        flat.write_text("".join(json.dumps({**r, "reward": 0.0}) + "\n" for r in rows))
        for name, rollouts in (("flat", flat), ("default", args.rollouts)):
            cmd = [sys.executable, "-m", BIN, "variance-compare", "--quiet", "--rollouts",
                   str(rollouts), "--out", str(Path(tmp) / name), "--draws", str(args.draws),
                   "--sketch-dim", str(args.sketch_dim)]  # fmt: skip
            _, wall = timed(lambda cmd=cmd: subprocess.run(cmd, check=True, capture_output=True))
            seconds.append(wall)
    return seconds[0], seconds[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--draws", type=int, default=200)
    parser.add_argument("--sketch-dim", type=int, default=256)
    parser.add_argument("--rollouts", type=Path, default=DEFAULT_ROLLOUTS, help="the pool")
    add_threads(parser, 2)
    args = parser.parse_args()
    print(pin_threads(args.threads))

    ckpt, batch, _ = checkpoint_batch(
        default_checkpoint(), load_rollouts(args.rollouts), LoadOptions()
    )
    tokens = int(batch.length.sum())
    checkpoint_stats(ckpt.model, batch)  # warm-up
    stats, t_stats = timed(lambda: checkpoint_stats(ckpt.model, batch))
    _, t_head = timed(lambda: token_scores(ckpt.model, batch, "head", args.sketch_dim, 0))

    def full_run():
        scores = token_scores(ckpt.model, batch, "full", args.sketch_dim, 0)
        return empirical_variance(
            returns_to_go(batch.token_rewards, batch.mask),
            batch.mask,
            batch.group,
            scores.proj,
            {"proxy": stats.w, "true": scores.sq_norm},
            specs=default_specs(("none", "mean", "grpo", "rloo", "optseq", "otb"), ["true"]),
            draws=args.draws,
            seed=0,
            mode="full",
        )

    _, t_full = timed(full_run)
    head_ratio = (tokens / t_head) / (tokens / t_stats)
    t_flat, t_default = no_signal_ratio(args)
    flat_ratio = t_flat / t_default
    load = os.getloadavg()[0]
    print(
        f"machine: {os.cpu_count()} cores, {torch.get_num_threads()} torch threads, "
        f"torch {torch.__version__}, python {platform.python_version()}, load {load:.2f}"
    )
    print(f"{'measurement':<48} {'value':>12} {'target':>10}  status")
    print(f"{'energy statistics pass (tokens/s)':<48} {tokens / t_stats:>12.0f}")
    print(f"{'head scores (tokens/s)':<48} {tokens / t_head:>12.0f}")
    print(
        f"{'head throughput / energy throughput':<48} {head_ratio:>12.2f} {'≥ 0.5':>10}  "
        f"{'PASS' if head_ratio >= 0.5 else 'FAIL'}"
    )
    print(
        f"{'full mode, all prompts, N=2..16, R=' + str(args.draws) + ' (s)':<48} "
        f"{t_full:>12.1f} {'≤ 120':>10}  {'PASS' if t_full <= 120 else 'FAIL'}"
    )
    print(f"{'variance-compare, every reward 0.0 (s)':<48} {t_flat:>12.1f}")
    pool = "embedded default" if args.rollouts == DEFAULT_ROLLOUTS else args.rollouts.name
    print(f"{'variance-compare, ' + pool + ' (s)':<48} {t_default:>12.1f}")
    print(
        f"{'no signal / with signal':<48} {flat_ratio:>12.3f} {'< ' + str(NO_SIGNAL_TARGET):>10}"
        f"  {'PASS' if flat_ratio < NO_SIGNAL_TARGET else 'FAIL'}"
    )
    print(
        json.dumps(
            {
                "rollouts": str(args.rollouts),
                "tokens": tokens,
                "stats_s": t_stats,
                "head_s": t_head,
                "head_over_energy": head_ratio,
                "full_s": t_full,
                "no_signal_s": t_flat,
                "with_signal_s": t_default,
                "no_signal_over_signal": flat_ratio,
                "threads": args.threads,
                "load": load,
            }
        )
    )


if __name__ == "__main__":
    main()
