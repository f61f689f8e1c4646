"""The result of `otb-diag figures`: figures.json's content as fields, and the text it prints.
figures.json is committed with the figures it describes and compared in review, so unlike the
run records it carries no schema version: `to_json()` is the file as it always was."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from otb_diag.pipelines.results.schema import plain
from otb_diag.pipelines.results.variance import ClaimVerdict, Recommendation


@dataclass(frozen=True)
class SweepRun:
    """One rate of the learning-rate sweep and its stability (`dynamics/lr_sweep.py:Stability`
    with its verdict)."""

    lr: float
    surge_step: int | None
    early_score: float
    late_score: float
    reward_collapse: bool
    unstable: bool


@dataclass(frozen=True)
class Sweep:
    """The learning-rate sweep (scenario long): the rate chosen, why, and each rate's run."""

    chosen_lr: float
    reason: str
    runs: list[SweepRun]


@dataclass(frozen=True)
class CollapseSteps:
    """A training's collapse, warning and lead steps (`results/dynamics.py:DynamicsRun`)."""

    run: str
    collapse_step: int | None
    warning_step: int | None
    lead_steps: int | None


@dataclass(frozen=True)
class FiguresResult:
    """What `otb-diag figures` made: each figure file and the command that made it, with the
    headline verdicts of the runs behind them."""

    scenario: str
    quick: bool
    seed: int
    figures: dict[str, str]  # file name -> the command that made it
    timings: dict[str, float]
    paper_claim: list[ClaimVerdict] | None
    noise_scale: Recommendation | None  # the variance run's recommendation
    sweep: Sweep | None  # the learning-rate sweep (scenario long)
    collapse: list[CollapseSteps]  # one per training

    def to_json(self) -> dict[str, Any]:
        return plain(self)

    def format(self, out: str) -> str:
        """One line per figure file with the command that made it, then where they went."""
        lines = [f"{name:<36} {command}" for name, command in self.figures.items()]
        return "\n".join([*lines, f"wrote {len(self.figures)} figures to {out}"])
