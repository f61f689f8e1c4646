"""`otb-diag dynamics`: training logs in, collapse detection, lead time and figures 1–2 out."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from otb_diag.cli.common import note, show
from otb_diag.cli.options import JSON, OUT_DIR, command

from otb_diag.knobs import Checked, knob
from otb_diag.pipelines.training_logs.settings import DynamicsSettings, TrainingLogs


@dataclass(frozen=True)
class DynamicsRun(Checked):
    out: Path = knob(Path("otb-dynamics"), OUT_DIR)
    as_json: bool = knob(False, JSON)


@command
def dynamics(logs: TrainingLogs, run: DynamicsRun, settings: DynamicsSettings) -> None:
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
    {figures} (PNG and PDF). With several logs, the comparison at equal tokens: comparison.csv
    (per arm, the runs sharing a --label: tokens to --target with a 95 % t interval over its
    seeds, final score, collapse per run) and its figure.

    Example:

        otb-diag dynamics --log grpo/metrics.jsonl --log otb/metrics.jsonl --target 0.6

        otb-diag dynamics --log verl_run.csv --label "otb N=4" --out dynamics/
    """
    from otb_diag.pipelines.training_logs.recipe import run_dynamics

    show(run_dynamics(logs, run.out, settings, say=note), run.as_json)
