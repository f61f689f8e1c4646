"""The knee controller (issue 47) judged on the steps-against-examples curve, twice:

    synthetic   tests/synthetic_knee.py's least squares, whose noise scale B(θ) is known and
                grows from ~17 to ~400 as it converges: fixed batches of 4 to 512 prompts
                (3 seeds each) draw the curve S = S_min (1 + B_eff / P), whose knee is
                (2 S_min, 2 E_min); a batch set to the true B(θ) (the oracle) and the
                controller, which reads only the pooled record of each step's samples, each
                over 5 seeds (seconds)
    toy         TRL's GRPOTrainer on the embedded checkpoint and the toy task, as
                bench/bench_train_compare.py runs it (4-digit prompts, groups of 4, learning
                rate 1e-4, here constant so that no arm's schedule differs): fixed 4, 8 and 16
                prompts an update (1×, 2×, 4× the base) for 400 updates, and the controller
                from 4 (`attach(trainer, controller="knee")`, its split at every 10th step)
                for 800 generation batches; 3 seeds each; `otb-diag dynamics` reads the
                updates and tokens each run took to the target score (minutes)

    python bench/bench_controller.py synthetic [--out DIR]
    python bench/bench_controller.py toy [--seeds 3] [--out DIR]

It runs on one torch thread by default (`--threads`, bench/threads.py, set before any work:
the toy's steps are launch-bound, and a second thread beside another job slowed them 40-fold,
issue 46); the numbers do not depend on the machine's load, only the wall times do. Prints a
table and one JSON line; writes the figure `steps_vs_examples.png` (synthetic) or the toy's runs
and `dynamics/` under --out.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "tests" / "integrations"))
sys.path.insert(0, str(ROOT / "bench"))

import synthetic_knee as truth  # noqa: E402
from threads import add_threads, pin_threads  # noqa: E402

from otb_diag.dynamics.comparison import mean_interval  # noqa: E402
from otb_diag.integrations.core.controller import KneeController, KneeRule  # noqa: E402

FIXED = (4, 8, 16, 32, 64, 128, 256, 512)  # the synthetic's fixed batches
BASE, MOST = 4, 1024  # the synthetic controller's base batch and ceiling
TOY_ARMS = (  # label, prompts a generation batch, controller
    ("grpo N=4 P=4", 4, None),
    ("grpo N=4 P=8", 8, None),
    ("grpo N=4 P=16", 16, None),
    ("grpo N=4 P=4 + controller", 4, "knee"),
)


def synthetic(out: Path) -> dict:
    """The synthetic truth's curve, oracle and controller, and the figure."""
    fixed = {p: [truth.train(100 + s, p) for s in range(3)] for p in FIXED}
    s_min, e_min = truth.knee_of_curve([(p, r.steps) for p, runs in fixed.items() for r in runs])
    knee = (2 * s_min, 2 * e_min)
    oracle = [truth.train(s, lambda b: max(1, round(b))) for s in range(5)]
    rule = KneeRule(base=BASE, most=MOST)
    controlled = [truth.train(s, 0, KneeController(rule, truth.ESTIMATOR)) for s in range(5)]
    rows = {
        "oracle": [(r.steps / knee[0], r.examples / knee[1]) for r in oracle],
        "controller": [(r.steps / knee[0], r.examples / knee[1]) for r in controlled],
    }
    print(f"fixed-batch curve: S_min = {s_min:.1f} steps, E_min = {e_min:.0f} examples, knee "
          f"B_eff = {e_min / s_min:.1f} prompts; its knee point ({knee[0]:.0f} steps, "
          f"{knee[1]:.0f} examples)")  # fmt: skip
    for name, ratios in rows.items():
        steps, examples = zip(*ratios, strict=True)
        s, e = mean_interval(steps), mean_interval(examples)  # Student's t 95 %
        print(f"{name:<11} steps / knee's {s[0]:.3f} [{s[1]:.3f}, {s[2]:.3f}], "
              f"examples / knee's {e[0]:.3f} [{e[1]:.3f}, {e[2]:.3f}] (5 seeds)")  # fmt: skip
    figure(fixed, (s_min, e_min), oracle, controlled, out / "steps_vs_examples.png")
    return {
        "s_min": s_min,
        "e_min": e_min,
        "fixed": {p: [(r.steps, r.examples) for r in runs] for p, runs in fixed.items()},
        "oracle": [(r.steps, r.examples) for r in oracle],
        "controller": [(r.steps, r.examples) for r in controlled],
        "ratios_to_knee": rows,
    }


def figure(fixed: dict, curve: tuple[float, float], oracle: list, controlled: list, path: Path):
    """Steps against examples: the fixed batches, the fitted curve and its knee, the oracle and
    the controller."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    s_min, e_min = curve
    fig, ax = plt.subplots(figsize=(6.4, 4.6), layout="constrained")
    for p, runs in fixed.items():
        ax.scatter([r.examples for r in runs], [r.steps for r in runs], s=14, color="0.45")
        ax.annotate(f"P={p}", (runs[0].examples, runs[0].steps), textcoords="offset points",
                    xytext=(4, 3), fontsize=7, color="0.35")  # fmt: skip
    e = np.geomspace(e_min * 1.02, e_min * 40, 200)
    ax.plot(e, s_min * (1 + 1 / (e / e_min - 1)), color="0.2", lw=1,
            label="fixed batches: (S/S_min − 1)(E/E_min − 1) = 1")  # fmt: skip
    ax.scatter([2 * e_min], [2 * s_min], marker="*", s=160, color="black", zorder=1,
               label="the curve's knee (2 E_min, 2 S_min)")  # fmt: skip
    ax.scatter([r.examples for r in oracle], [r.steps for r in oracle], marker="x", s=40,
               color="tab:green", zorder=3,
               label="batch = true B(θ) each step (oracle)")  # fmt: skip
    ax.scatter([r.examples for r in controlled], [r.steps for r in controlled], marker="o",
               s=36, facecolors="none", edgecolors="tab:red", linewidths=1.5, zorder=3,
               label="knee controller (reads samples only)")  # fmt: skip
    ax.set(xscale="log", yscale="log", xlabel="examples (prompts) to the target",
           ylabel="optimizer steps to the target",
           title="Synthetic truth: steps against examples, 3–5 seeds each")  # fmt: skip
    ax.legend(fontsize=8, loc="upper right")
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=150)
    plt.close(fig)


def toy(args: argparse.Namespace) -> dict:
    """The TRL arms (module docstring), then `otb-diag dynamics` over them."""
    from bench_train_compare import prompts
    from trl_toy import toy_trainer

    from otb_diag.integrations.trl import attach
    from otb_diag.pipelines.training_logs.recipe import run_dynamics
    from otb_diag.pipelines.training_logs.settings import DynamicsSettings, TrainingLogs

    logs, labels, runs = [], [], []
    for label, per_step, controller in TOY_ARMS:
        for seed in range(args.seeds):
            folder = args.out / "runs" / f"{label.replace(' ', '-').replace('=', '')}-s{seed}"
            steps = 2 * args.updates if controller else args.updates
            trainer = toy_trainer(folder, steps, per_step=per_step * 4, prompts=prompts(),
                                  seed=seed, learning_rate=args.lr,
                                  lr_scheduler_type="constant")  # fmt: skip
            if controller:
                attach(trainer, controller=controller)
            start = time.perf_counter()
            trainer.train()
            trainer.state.save_to_json(str(folder / "trainer_state.json"))
            runs.append({"run": folder.name, "wall_s": time.perf_counter() - start})
            logs.append(folder / "trainer_state.json")
            labels.append(label)
    result = run_dynamics(
        TrainingLogs(logs, labels), args.out / "dynamics", DynamicsSettings(target=args.target)
    )
    print(result.format())
    return {"runs": runs, "comparison": [vars(arm) for arm in result.arms]}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("part", choices=("synthetic", "toy"))
    parser.add_argument("--seeds", type=int, default=3, help="toy: seeds an arm")
    parser.add_argument("--updates", type=int, default=400, help="toy: fixed arms' updates")
    parser.add_argument("--lr", type=float, default=1e-4, help="toy: constant learning rate")
    parser.add_argument("--target", type=float, default=0.8, help="toy: the target score")
    parser.add_argument("--out", type=Path, default=ROOT / "out" / "controller")
    add_threads(parser, 1)
    args = parser.parse_args()
    print(pin_threads(args.threads))
    args.out.mkdir(parents=True, exist_ok=True)
    record = synthetic(args.out) if args.part == "synthetic" else toy(args)
    print(json.dumps({"part": args.part, "threads": args.threads, **record}, default=str))


if __name__ == "__main__":
    main()
