"""`otb-diag figures`: regenerate the paper-style figure set from the embedded default."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from otb_diag.cli.common import show
from otb_diag.cli.options import OUT_DIR, Measuring, command

from otb_diag.knobs import knob
from otb_diag.pipelines.figures.settings import FiguresSettings


@dataclass(frozen=True)
class FiguresRun(Measuring):
    out: Path = knob(Path("figures"), OUT_DIR)


@command(skip=("inputs.ckpt", "inputs.rollouts"))  # the scenario's own
def figures(run: FiguresRun, settings: FiguresSettings) -> None:
    """Regenerate every figure from an embedded scenario: fig1–fig5, variance against N, ratio
    to the mean baseline, proxy fidelity, score against tokens sampled. Runs energy,
    variance-compare, toy trainings and dynamics; working outputs go under OUT/runs/, figures
    (PNG and PDF) into OUT/, and figures.json says which command made each.

    Default scenario: four 30-step trainings (mean N=4, mean N=16, otb N=4, optseq N=4; same
    seed), a few minutes. Long scenario (about an hour on 2 cores with --jobs 2):
    variance-compare proxy/head/full at N=2…64 (k = 16 directions), a learning-rate sweep of
    mean N=4 (2 prompts per step) for 200 steps at 3e-4, 1e-3 and 3e-3, then otb and optseq N=4
    at the lowest rate where mean became unstable (lr_sweep_fig1_grad_norm_and_score.png shows
    the sweep; figures.json gives each rate's verdict).

    Example: otb-diag figures --out figures/
    """
    from otb_diag.pipelines.figures.recipe import run_figures

    result = run_figures(run.inputs, run.out, settings, progress=not run.quiet)
    show(result, run.as_json, out=str(run.out))
