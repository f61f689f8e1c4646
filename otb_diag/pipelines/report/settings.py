"""What `otb-diag report` reads, declared once (the command line is built from it): the run
directories and, to compare with, a golden file. It has no other knob."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from otb_diag.knobs import Checked, knob


@dataclass(frozen=True)
class ReportInputs(Checked):
    """The runs to report (RUN_DIR, repeatable) and the golden file of `--golden`."""

    run_dirs: list[Path] = knob(
        argument=True,
        metavar="RUN_DIR",
        help="Output directories of energy, variance-compare, dynamics, train (or a regress "
        "--junit file's directory), or directories holding several.",
    )
    golden: Path | None = knob(
        None,
        metavar="FILE",
        help="Golden file of `otb-diag regress`: adds the regression status of the "
        "energy/variance-compare runs (names relative to each RUN_DIR).",
    )
