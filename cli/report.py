"""`otb-diag report`: one self-contained HTML page from the outputs of the other commands."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from otb_diag.cli.common import friendly_errors


@friendly_errors
def report(
    run_dirs: Annotated[
        list[Path],
        typer.Argument(
            metavar="RUN_DIR",
            help="Output directories of energy, variance-compare, dynamics, train (or a "
            "regress --junit file's directory), or directories holding several.",
        ),
    ],
    out: Annotated[Path, typer.Option("--out", help="HTML file to write.")] = Path("report.html"),
    golden: Annotated[
        Path | None,
        typer.Option(
            "--golden",
            metavar="FILE",
            help="Golden file of `otb-diag regress`: adds the regression status of the "
            "energy/variance-compare runs (names relative to each RUN_DIR).",
        ),
    ] = None,
) -> None:
    """Write one HTML page that opens offline: the verdicts first (OTB's mean-equivalent
    group size and token saving per mode, the paper-claim verdict, proxy fidelity, collapse
    and lead time per run, the regression status), then the figures with captions, the
    tables with units and definitions, and provenance (inputs and hashes, settings, seeds,
    library versions, the command that redraws each figure). Missing pieces are named on the
    page.

    Example:

        otb-diag energy --out runs/energy

        otb-diag variance-compare --out runs/variance

        otb-diag report runs --out report.html
    """
    from otb_diag.pipelines.report.recipe import write_report

    path = write_report(run_dirs, out, golden)
    typer.echo(f"wrote {path.resolve()}")
