"""Every knob of `otb-diag train`, declared once (the command line is built from them; no torch
at import: the registries are read when the help is shown)."""

from __future__ import annotations

from dataclasses import dataclass

from otb_diag.knobs import internal, knob
from otb_diag.pipelines.measure_knobs import aggregation_names, baseline_names


@dataclass(frozen=True)
class TrainSettings:
    """Every knob of `otb-diag train` (the CLI's options, with the same defaults). None in
    `max_new_tokens` and `prompt_cells` is the scenario's (`rl_training.py:for_scenario`)."""

    baseline: str = knob(
        "otb", help=lambda: f"Any registry baseline: {', '.join(baseline_names())}."
    )
    aggregation: str = knob(
        "token-sum",
        help=lambda: f"How token terms are averaged: {', '.join(aggregation_names())}.",
    )
    group_size: int = knob(4, help="Responses sampled per prompt (N).")
    prompts_per_step: int = knob(8, help="Prompts (groups) per step.")
    steps: int = knob(
        20, flag="--updates", min=1, help="Optimizer updates to take, one per training step."
    )
    lr: float = knob(1e-4, help="AdamW learning rate (no weight decay).")
    max_grad_norm: float = knob(1.0, help="Clip the gradient norm to this (0: off).")
    temperature: float = knob(1.0, help="Sampling temperature τ.")
    max_new_tokens: int | None = knob(
        None, help="Longest response sampled. Default: the scenario's (default 64, long 400)."
    )
    save_every: int = knob(10, help="Save checkpoint-<step> every this many steps (0: last only).")
    seed: int = knob(0, help="Seed of prompts and sampling: same seed, same run.")
    prompt_cells: tuple[tuple[str, int], ...] | None = internal(None)  # (op, digits) drawn
