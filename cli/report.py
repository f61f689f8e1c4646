"""`otb-diag report`: one self-contained HTML page from the outputs of the other commands."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from otb_diag.cli.common import show
from otb_diag.cli.options import JSON, OUT_FILE, command

from otb_diag.knobs import Checked, knob
from otb_diag.pipelines.report.settings import ReportInputs


@dataclass(frozen=True)
class ReportRun(Checked):
    out: Path = knob(Path("report.html"), OUT_FILE)
    as_json: bool = knob(False, JSON)


@command
def report(inputs: ReportInputs, run: ReportRun) -> None:
    """Write one HTML page that opens offline: the verdicts first (OTB's mean-equivalent
    group size and token saving per mode, the paper-claim verdict, proxy fidelity, collapse
    and lead time per run, the regression status), then the figures with captions, the
    tables with units and definitions, and provenance (inputs and hashes, settings, seeds,
    library versions, the command that redraws each figure). Missing pieces are named on the
    page. --out is the HTML file; --json prints the runs found and the verdicts instead of the
    path written.

    Example:

        otb-diag energy --out runs/energy

        otb-diag variance-compare --out runs/variance

        otb-diag report runs --out report.html
    """
    from otb_diag.pipelines.report.recipe import run_report

    show(run_report(inputs, run.out), run.as_json)
