"""Every knob of `otb-diag train`, declared once (the command line is built from them; no torch
at import: the registries are read when the help is shown)."""

from __future__ import annotations

from dataclasses import dataclass

from otb_diag.knobs import Checked, above, at_least, internal, knob, valid_seed
from otb_diag.pipelines.measure_knobs import aggregation_names, baseline_names


@dataclass(frozen=True)
class TrainSettings(Checked):
    """Every knob of `otb-diag train` (the CLI's options, with the same defaults). None in
    `max_new_tokens` and `prompt_cells` is the scenario's (`rl_training.py:for_scenario`)."""

    baseline: str = knob(
        "otb", help=lambda: f"Any registry baseline: {', '.join(baseline_names())}."
    )
    aggregation: str = knob(
        "token-sum",
        help=lambda: f"How token terms are averaged: {', '.join(aggregation_names())}.",
    )
    group_size: int = knob(4, at_least(1), help="Responses sampled per prompt (N).")
    prompts_per_step: int = knob(8, at_least(1), help="Prompts (groups) per step.")
    steps: int = knob(
        20,
        at_least(1),
        flag="--updates",
        help="Optimizer updates to take, one per training step.",
    )
    lr: float = knob(1e-4, above(0), help="AdamW learning rate (no weight decay).")
    max_grad_norm: float = knob(1.0, at_least(0), help="Clip the gradient norm to this (0: off).")
    temperature: float = knob(1.0, above(0), help="Sampling temperature τ.")
    max_new_tokens: int | None = knob(
        None,
        at_least(1),
        help="Longest response sampled. Default: the scenario's (default 64, long 400).",
    )
    save_every: int = knob(
        10, at_least(0), help="Save checkpoint-<step> every this many steps (0: last only)."
    )
    seed: int = knob(0, valid_seed, help="Seed of prompts and sampling: same seed, same run.")
    prompt_cells: tuple[tuple[str, int], ...] | None = internal(None)  # (op, digits) drawn

    def check(self) -> None:
        """Raise `InputError` for a baseline or an aggregation its registry does not know, at
        the top of the entry point, before anything is loaded (the registries import torch:
        not when the object is built)."""
        from otb_diag.maths.aggregation import check_aggregation
        from otb_diag.maths.estimators.registry import get_baseline

        get_baseline(self.baseline)  # an unknown name lists the known ones
        check_aggregation(self.aggregation)
