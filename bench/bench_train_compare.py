"""The comparison of docs/train-with-otb.md: TRL's GRPOTrainer on the embedded checkpoint and
the toy task (4-digit copy, reverse and sort prompts; tests/integrations/trl_toy.py's trainer
and rewards), trained three ways at the same prompts per step, each with several seeds, on one
torch thread (`--threads`; its float sums, so its tokens and scores, depend on the count):

    grpo N=4    TRL alone (its own advantages), groups of 4
    otb N=4     attach(trainer, advantages="otb"): OTB's token-level advantages, groups of 4
    grpo N=16   TRL alone, groups of 16 (4 times the tokens per step)

then read by `otb-diag dynamics` (the runs of one arm share a --label, so its comparison view
gives each arm's tokens to the target score with an interval over the seeds).

    python bench/bench_train_compare.py                      # 3 arms x 3 seeds, 400 steps each
                                                             # (~4 min on one idle core)
    python bench/bench_train_compare.py --steps 2 --seeds 1  # the smallest path
    python bench/bench_train_compare.py --cost               # seconds per step, N = 4

`--cost` times instead, seed 0 and groups of 4, --steps steps each: TRL alone, with
`attach(trainer)` (the diagnostics, no split) and with `attach(trainer, advantages="otb")` (the
same and OTB's advantages: one no-grad forward more per step); the median step of each after 5
steps of warm-up.

Writes under --out (default out/train-compare, outside git): runs/<arm>-s<seed>/trainer_state.json
for each run, and dynamics/ (dynamics.csv, collapse.json, comparison.csv, the figures). Prints
the dynamics report, then one JSON line: per run its wall time and seconds per step (a timing
taken beside other jobs says little), and the comparison's rows. Its first line gives the thread
count and the machine's load: with two threads beside another job a step went from 0.07 s to 3 s.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "integrations"))
sys.path.insert(0, str(ROOT / "bench"))  # when imported (tests/bench/), not run from bench/

from threads import add_threads, pin_threads  # noqa: E402
from trl_toy import toy_trainer  # noqa: E402

from otb_diag.integrations.trl import attach  # noqa: E402
from otb_diag.lab.task import PLAIN_OPS, make_problems  # noqa: E402
from otb_diag.pipelines.training_logs.recipe import run_dynamics  # noqa: E402
from otb_diag.pipelines.training_logs.settings import (  # noqa: E402
    DynamicsSettings,
    TrainingLogs,
)

# (label, advantages, group size): the label names the baseline and N for `dynamics`.
ARMS = (("grpo N=4", None, 4), ("otb N=4", "otb", 4), ("grpo N=16", None, 16))
PROMPT_SEED = 0
N_PROMPTS = 256  # distinct 4-digit problems the runs draw their prompts from
DIGITS = 4  # seven-token prompts, all alike: TRL pads none (trl_toy.py)


def prompts() -> list[str]:
    rng = np.random.default_rng(PROMPT_SEED)
    return [p.prompt for p in make_problems(rng, N_PROMPTS, DIGITS, PLAIN_OPS)]


def train_one(
    folder: Path, advantages: str | None, group: int, seed: int, args: argparse.Namespace
) -> dict:
    """One run; its trainer_state.json in `folder`; its timing."""
    trainer = toy_trainer(
        folder,
        args.steps,
        per_step=args.prompts_per_step * group,
        prompts=prompts(),
        num_generations=group,
        seed=seed,
        learning_rate=args.lr,
    )
    if advantages is not None:
        attach(trainer, advantages=advantages, split_every=None)
    start = time.perf_counter()
    trainer.train()
    wall = time.perf_counter() - start
    trainer.state.save_to_json(str(folder / "trainer_state.json"))
    return {"run": folder.name, "wall_s": wall, "s_per_step": wall / args.steps}


def step_cost(args: argparse.Namespace) -> dict[str, float]:
    """Median seconds per step (after 5 of warm-up) of TRL alone, with the diagnostics, and
    with the diagnostics and OTB's advantages (`--cost`)."""
    from transformers import TrainerCallback

    class Timer(TrainerCallback):
        def __init__(self) -> None:
            self.times: list[float] = []

        def on_step_begin(self, *_, **__) -> None:
            self.start = time.perf_counter()

        def on_step_end(self, *_, **__) -> None:
            self.times.append(time.perf_counter() - self.start)

    cost = {}
    for name, options in (("plain", None), ("attach", {}), ("attach-otb", {"advantages": "otb"})):
        folder, per_step = args.out / "cost" / name, args.prompts_per_step * 4
        trainer = toy_trainer(folder, args.steps, per_step=per_step, prompts=prompts(), seed=0,
                              learning_rate=args.lr)  # fmt: skip
        if options is not None:
            attach(trainer, split_every=None, **options)
        timer = Timer()
        trainer.add_callback(timer)
        trainer.train()
        cost[name] = float(np.median(timer.times[5:]))
    return cost


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--prompts-per-step", type=int, default=4)
    parser.add_argument("--lr", type=float, default=1e-4)
    parser.add_argument("--target", type=float, default=0.8, help="score for tokens-to-target")
    parser.add_argument("--out", type=Path, default=ROOT / "out" / "train-compare")
    parser.add_argument("--cost", action="store_true", help="time a step instead (see above)")
    add_threads(parser, 1)
    args = parser.parse_args()
    print(pin_threads(args.threads), flush=True)
    if args.cost:
        cost = step_cost(args)
        for name, seconds in cost.items():
            print(f"{name:<11} {1e3 * seconds:7.1f} ms/step  ({seconds / cost['plain'] - 1:+.0%})")
        print(json.dumps({"steps": args.steps, "threads": args.threads, "seconds_per_step": cost}))
        return

    logs, labels, runs = [], [], []
    for label, advantages, group in ARMS:
        for seed in range(args.seeds):
            folder = args.out / "runs" / f"{label.replace(' ', '-').replace('=', '')}-s{seed}"
            runs.append(train_one(folder, advantages, group, seed, args))
            logs.append(folder / "trainer_state.json")
            labels.append(label)
    result = run_dynamics(
        TrainingLogs(logs, labels), args.out / "dynamics", DynamicsSettings(target=args.target)
    )
    print(result.format())
    record = {
        "steps": args.steps,
        "seeds": args.seeds,
        "prompts_per_step": args.prompts_per_step,
        "lr": args.lr,
        "target": args.target,
        "threads": args.threads,
        "runs": runs,
        "comparison": [vars(arm) for arm in result.arms],
    }
    print(json.dumps(record))


if __name__ == "__main__":
    main()
