"""Every knob of `otb-diag dynamics`, declared once (the command line is built from them): the
logs it reads, as given (`TrainingLogs`), and how it reads them (`DynamicsSettings`)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from otb_diag.dynamics.detection_rule import DetectionRule
from otb_diag.errors import InputError
from otb_diag.knobs import Checked, knob, named


@dataclass(frozen=True)
class TrainingLogs(Checked):
    """The training logs `dynamics` reads (--log) and the name of each run (--label)."""

    logs: list[Path] = knob(
        flag="--log",
        metavar="FILE",
        help="Training log, repeatable: otb-diag metrics.jsonl, verl metrics (JSONL, or a W&B "
        "CSV export of one run) or a HF/TRL trainer_state.json.",
    )
    labels: list[str] | None = knob(
        None,
        lambda labels: next(filter(None, map(named, labels)), None),
        flag="--label",
        metavar="NAME",
        help="Run name, one per --log in order. A registry baseline family (e.g. mean, otb) and "
        "'N=4' in it fill what the log does not record. Runs sharing a label are one arm's "
        "seeds in the comparison at equal tokens. Default: the file name.",
    )

    def together(self) -> None:
        """One label per log, or none."""
        if self.labels and len(self.labels) != len(self.logs):
            raise InputError(
                f"{len(self.labels)} --label for {len(self.logs)} --log: give one label per "
                "log, or none"
            )


@dataclass(frozen=True)
class DynamicsSettings(Checked):
    """Every knob of `otb-diag dynamics` beside its logs: the score target and the rules."""

    target: float | None = knob(
        None,
        lambda x: None if math.isfinite(x) else f"must be a finite score, got {x}",
        help="Score whose first crossing gives tokens-to-target.",
    )
    rule: DetectionRule = DetectionRule()
