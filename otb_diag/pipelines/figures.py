"""`otb-diag figures`: the whole paper-style figure set from the embedded default, in one run.

It runs, with fixed seeds, exactly the public commands' library entry points:
`energy` (figures 3–5 and the energy across checkpoints), `variance-compare` (variance against N,
ratio to the mean baseline, proxy fidelity), short toy trainings — `mean` at N = 4 and N = 16,
`otb` and `optseq` at N = 4, same seeds — and `dynamics` on their logs (figures 1–2, score
against tokens sampled). Working directories go under `out/runs/`; the figures are copied to
`out/` (PNG and PDF)."""

from __future__ import annotations

import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from otb_diag.io.atomic import write_json
from otb_diag.io.defaults import DEFAULT_ROLLOUTS, default_checkpoint, default_checkpoints
from otb_diag.maths.collapse import DetectionRule
from otb_diag.pipelines.dynamics import run_dynamics
from otb_diag.pipelines.energy import run_energy
from otb_diag.pipelines.train import TrainSettings, train
from otb_diag.pipelines.variance import VarianceSettings, run_variance

# The runs behind score-against-tokens: (baseline, N); same seed, so the same prompts per step.
TRAININGS = (("mean", 4), ("mean", 16), ("otb", 4), ("optseq", 4))


@dataclass(frozen=True)
class FigurePlan:
    """How much work each part does: the full set, or `quick` (for CI, a few minutes)."""

    train_steps: int
    variance_modes: tuple[str, ...]
    draws: int
    bootstrap: int
    sketch_dim: int

    @classmethod
    def make(cls, quick: bool) -> FigurePlan:
        if quick:
            return cls(
                train_steps=4, variance_modes=("head",), draws=40, bootstrap=200, sketch_dim=64
            )
        return cls(
            train_steps=30,
            variance_modes=("proxy", "head", "full"),
            draws=200,
            bootstrap=1000,
            sketch_dim=256,
        )


def run_figures(
    out: Path, *, quick: bool = False, seed: int = 0, progress: bool = True
) -> dict[str, Any]:
    """Regenerate every figure into `out`; returns (and writes as `figures.json`) a record of
    what made each file."""
    plan = FigurePlan.make(quick)
    runs = out / "runs"
    timings: dict[str, float] = {}
    made: dict[str, str] = {}

    def keep(run_dir: Path, names: list[str], command: str) -> None:
        for name in names:
            for ext in ("png", "pdf"):
                shutil.copyfile(run_dir / f"{name}.{ext}", out / f"{name}.{ext}")
            made[f"{name}.png"] = command

    t0 = time.perf_counter()
    run_energy(default_checkpoints(), DEFAULT_ROLLOUTS, runs / "energy", progress=progress)
    keep(
        runs / "energy",
        [
            "fig3_sequence_energy",
            "fig4_cumulative_energy",
            "fig5_probability_vs_gradient",
            "fig_energy_by_step",
        ],
        "otb-diag energy --ckpt otb_diag/lab/default/checkpoints",
    )
    timings["energy_s"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    settings = VarianceSettings(
        modes=plan.variance_modes,
        draws=plan.draws,
        bootstrap=plan.bootstrap,
        sketch_dim=plan.sketch_dim,
        seed=seed,
    )
    run_variance(
        [default_checkpoint()], DEFAULT_ROLLOUTS, runs / "variance", settings, progress=progress
    )
    exact = plan.variance_modes[-1]
    keep(
        runs / "variance",
        [f"variance_vs_n_{exact}", f"ratio_to_mean_{exact}", "proxy_fidelity"],
        f"otb-diag variance-compare --mode {','.join(plan.variance_modes)} "
        f"--draws {plan.draws} --sketch-dim {plan.sketch_dim}",
    )
    timings["variance_s"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    logs, labels = [], []
    for baseline, n in TRAININGS:
        run_dir = runs / f"train-{baseline}-n{n}"
        train(
            default_checkpoint(),
            run_dir,
            TrainSettings(
                baseline=baseline, group_size=n, steps=plan.train_steps, seed=seed, save_every=0
            ),
            progress=progress,
        )
        logs.append(run_dir / "metrics.jsonl")
        labels.append(f"{baseline} N={n}")
    timings["train_s"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    report = run_dynamics(logs, labels, runs / "dynamics", DetectionRule(), target=None)
    keep(
        runs / "dynamics",
        ["fig1_grad_norm_and_score", "fig2_variance_and_grad_norm", "score_vs_tokens"],
        f"otb-diag train --steps {plan.train_steps} (mean N=4, mean N=16, otb N=4, optseq N=4)"
        " then otb-diag dynamics",
    )
    timings["dynamics_s"] = time.perf_counter() - t0

    record = {
        "quick": quick,
        "seed": seed,
        "figures": made,
        "timings": timings,
        "collapse": [
            {k: r.get(k) for k in ("run", "collapse_step", "lead_steps")} for r in report["runs"]
        ],
    }
    write_json(out / "figures.json", record)
    return record
