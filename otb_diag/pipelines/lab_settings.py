"""The knob of `otb-diag lab build`, declared once (the command line is built from it; no torch
at import, so the CLI starts light: `pipelines/lab_build.py` imports the lab's torch code)."""

from __future__ import annotations

from dataclasses import dataclass

from otb_diag.knobs import Checked, knob, valid_seed


@dataclass(frozen=True)
class LabSettings(Checked):
    seed: int = knob(0, valid_seed, help="Seed of every random draw: same seed, same lab.")
