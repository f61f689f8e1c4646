"""Every knob of `otb-diag figures`, declared once (the command line is built from them)."""

from __future__ import annotations

from dataclasses import dataclass

from otb_diag.knobs import Checked, at_least, knob, valid_seed


@dataclass(frozen=True)
class FiguresSettings(Checked):
    """How thoroughly, with which seed, how many trainings at once (the scenario: `Inputs`)."""

    quick: bool = knob(False, help="Fewer steps and draws (a CI smoke run).")
    seed: int = knob(0, valid_seed, help="Seed of every run.")
    jobs: int = knob(1, at_least(1), help="Trainings run at once (processes of one thread each).")
