"""Every knob of `otb-diag figures`, declared once (the command line is built from them)."""

from __future__ import annotations

from dataclasses import dataclass

from otb_diag.knobs import knob


@dataclass(frozen=True)
class FiguresSettings:
    """How thoroughly, with which seed, how many trainings at once (the scenario: `Inputs`)."""

    quick: bool = knob(False, help="Fewer steps and draws (a CI smoke run).")
    seed: int = knob(0, help="Seed of every run.")
    jobs: int = knob(1, help="Trainings run at once (processes of one thread each).")
