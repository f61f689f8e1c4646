"""Every knob of `otb-diag regress`, declared once (the command line is built from them): what it
compares (`RegressInputs`) and how (`RegressSettings`)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from otb_diag.knobs import Checked, knob


def _default_tolerance() -> str:
    from otb_diag.pipelines.regress.golden import DEFAULT_TOLERANCE

    return str(DEFAULT_TOLERANCE)


@dataclass(frozen=True)
class RegressInputs(Checked):
    """What `otb-diag regress` compares: the golden file and the run (or runs) of now."""

    golden: Path = knob(help="Golden JSON file (written by --update).")
    current: Path = knob(
        help="Run directory of `otb-diag energy` / `variance-compare`, or a directory holding "
        "several (metric names are prefixed with each run's sub-directory)."
    )


@dataclass(frozen=True)
class RegressSettings(Checked):
    """Every knob of `otb-diag regress` beside its inputs: rewrite or compare, and how."""

    update: bool = knob(False, help="Rewrite the golden file from --current; print changes.")
    junit: Path | None = knob(None, help="Also write a JUnit XML report (one testcase per metric).")
    tolerances: Path | None = knob(
        None,
        help=lambda: (
            'JSON {"fnmatch pattern": {"rel": .., "abs": ..}} for deterministic '
            f"metrics; the last matching pattern wins. Default {_default_tolerance()}."
        ),
    )
