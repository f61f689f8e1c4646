"""`otb-diag dynamics`: training logs in, collapse detection, lead time and figures 1–2 out."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from otb_diag.cli.common import JsonOption, OutOption, friendly_errors, print_json


@friendly_errors
def dynamics(
    log: Annotated[
        list[Path],
        typer.Option(
            "--log",
            metavar="FILE",
            help="Training log, repeatable: otb-diag metrics.jsonl, verl metrics (JSONL, or a "
            "W&B CSV export of one run) or a HF/TRL trainer_state.json.",
        ),
    ],
    label: Annotated[
        list[str] | None,
        typer.Option(
            "--label",
            metavar="NAME",
            help="Run name, one per --log in order. A registry baseline family (e.g. mean, "
            "otb) and 'N=4' in it fill what the log does not record. Default: the file name.",
        ),
    ] = None,
    out: OutOption = Path("otb-dynamics"),
    target: Annotated[
        float | None,
        typer.Option("--target", help="Score whose first crossing gives tokens-to-target."),
    ] = None,
    window: Annotated[
        int, typer.Option("--window", min=5, help="Trailing logged points of the z-score.")
    ] = 30,
    threshold: Annotated[
        float, typer.Option("--threshold", min=0.0, help="Robust z of a gradient-norm surge.")
    ] = 6.0,
    persist: Annotated[
        int, typer.Option("--persist", min=1, help="Consecutive points an alarm must last.")
    ] = 3,
    lead_threshold: Annotated[
        float, typer.Option("--lead-threshold", min=0.0, help="Robust z of a variance rise.")
    ] = 3.0,
    lead_horizon: Annotated[
        int,
        typer.Option("--lead-horizon", min=1, help="Points before a collapse searched for it."),
    ] = 50,
    smooth: Annotated[
        int, typer.Option("--smooth", min=1, help="Trailing points averaged for the score.")
    ] = 5,
    as_json: JsonOption = False,
) -> None:
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
    fig1_grad_norm_and_score, fig2_variance_and_grad_norm, score_vs_tokens (PNG and PDF).

    Example:

        otb-diag dynamics --log grpo/metrics.jsonl --log otb/metrics.jsonl --target 0.6

        otb-diag dynamics --log verl_run.csv --label "otb N=4" --out dynamics/
    """
    from otb_diag.dynamics.collapse import DetectionRule
    from otb_diag.pipelines.dynamics import default_names, run_dynamics

    rule = DetectionRule(
        window=window,
        min_points=min(10, window),  # the z-score needs this much history
        threshold=threshold,
        persist=persist,
        lead_threshold=lead_threshold,
        lead_horizon=lead_horizon,
        smooth=smooth,
    )
    result = run_dynamics(log, label or default_names(log), out, rule, target)
    if as_json:
        print_json(result.to_json())
    else:
        typer.echo(result.format())
