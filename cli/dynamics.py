"""`otb-diag dynamics`: training logs in, collapse detection, lead time and figures 1–2 out."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from otb_diag.cli.common import show
from otb_diag.cli.options import JSON, OUT_DIR, command

from otb_diag.dynamics.detection_rule import DetectionRule
from otb_diag.knobs import knob


@dataclass(frozen=True)
class DynamicsRun:
    log: list[Path] = knob(
        metavar="FILE",
        help="Training log, repeatable: otb-diag metrics.jsonl, verl metrics (JSONL, or a W&B "
        "CSV export of one run) or a HF/TRL trainer_state.json.",
    )
    label: list[str] | None = knob(
        None,
        metavar="NAME",
        help="Run name, one per --log in order. A registry baseline family (e.g. mean, otb) and "
        "'N=4' in it fill what the log does not record. Runs sharing a label are one arm's "
        "seeds in the comparison at equal tokens. Default: the file name.",
    )
    out: Path = knob(Path("otb-dynamics"), OUT_DIR)
    target: float | None = knob(None, help="Score whose first crossing gives tokens-to-target.")
    as_json: bool = knob(False, JSON)


@command
def dynamics(run: DynamicsRun, rule: DetectionRule) -> None:
    """Detect training collapse in RL logs and measure how early the gradient variance warned.

    A collapse is a lasting surge of the gradient norm: the robust z-score of log grad_norm
    against the median and MAD of the previous --window logged points exceeds --threshold for
    --persist consecutive points. The warning is the first rise of the logged variance proxy
    (proxy2_total_power, else proxy3_pure_noise; no lead time without one) above
    --lead-threshold by the same rule, among the --lead-horizon points up to the collapse; the
    lead time is the steps between the two. With --target, also the tokens sampled until the
    trailing --smooth-point mean score first reaches it.

    Writes into --out: dynamics.csv (every run and step, tidy), collapse.json (per run: collapse
    step, warning step, lead, tokens to target, and the rule's parameters) and the figures
    fig1_grad_norm_and_score, fig2_variance_and_grad_norm, score_vs_tokens (PNG and PDF). With
    several logs, the comparison at equal tokens: comparison.csv (per arm, the runs sharing a
    --label: tokens to --target with a 95 % t interval over its seeds, final score, collapse per
    run) and the figure baseline_comparison.

    Example:

        otb-diag dynamics --log grpo/metrics.jsonl --log otb/metrics.jsonl --target 0.6

        otb-diag dynamics --log verl_run.csv --label "otb N=4" --out dynamics/
    """
    from otb_diag.pipelines.training_logs.recipe import run_dynamics

    result = run_dynamics(run.log, run.label, run.out, rule, run.target)
    show(result, run.as_json)
