"""`otb-diag variance-compare`: empirical policy-gradient variance under each baseline."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from otb_diag.cli.common import note, show
from otb_diag.cli.options import OUT_DIR, Measuring, command

from otb_diag.knobs import knob
from otb_diag.pipelines.variance.settings import VarianceSettings


@dataclass(frozen=True)
class VarianceRun(Measuring):
    out: Path = knob(Path("otb-variance"), OUT_DIR)


@command
def variance_compare(run: VarianceRun, settings: VarianceSettings) -> None:
    """Does a baseline really lower the variance of the policy gradient on your model and data?
    From pools of M responses per prompt, draw R groups of N per prompt (the same draws for
    every baseline), compute the gradient estimate with real per-token score vectors, and
    report its variance with a bootstrap 95 % interval, the ratio to the mean baseline, a bias
    z-score against no baseline, and the equivalent group size: the N′ at which the mean baseline
    reaches this baseline's variance (the paper's "OTB at N = 4 matches mean at N = 32").

    Then how many prompts a step needs: the noise of a step split into within-prompt variance
    (what a baseline reduces) and between-prompt spread (what none does), the gradient noise
    scale B = tr Σ/|G|² in prompts and in tokens per step, and the (baseline, N) whose knee
    costs the fewest tokens, beside mean at --current-n. Use head or full mode for the knee:
    proxy scores carry no signal (|G|² = 0), so proxy mode gives the split only.

    Writes variance.csv, noise_scale.csv, fidelity.csv, summary.json and figures (variance
    against N, ratio to mean, tokens at the knee, proxy fidelity) into --out.

    Example: otb-diag variance-compare --mode head,full --group-sizes 2,4,8 --draws 200
    """
    from otb_diag.pipelines.variance.recipe import run_variance

    result = run_variance(run.inputs, run.out, settings, progress=not run.quiet, say=note)
    show(result, run.as_json)
