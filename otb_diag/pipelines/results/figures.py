"""The result of `otb-diag figures`: figures.json's content as fields, and the text it prints.
figures.json is committed with the figures it describes and compared in review, so unlike the
run records it carries no schema version: `to_json()` is the file as it always was."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from otb_diag.pipelines.results.variance import ClaimVerdict


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
    noise_scale: dict[str, Any] | None  # the variance run's recommendation
    sweep: dict[str, Any] | None  # the learning-rate sweep (scenario long)
    collapse: list[dict[str, Any]]  # run, collapse, warning and lead steps per training

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    def format(self, out: str) -> str:
        """One line per figure file with the command that made it, then where they went."""
        lines = [f"{name:<36} {command}" for name, command in self.figures.items()]
        return "\n".join([*lines, f"wrote {len(self.figures)} figures to {out}"])
