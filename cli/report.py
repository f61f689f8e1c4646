"""`otb-diag report`: one self-contained HTML page from the outputs of the other commands."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from otb_diag.cli.common import JsonOption, OutFileOption, friendly_errors, print_json


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
    out: OutFileOption = Path("report.html"),
    golden: Annotated[
        Path | None,
        typer.Option(
            "--golden",
            metavar="FILE",
            help="Golden file of `otb-diag regress`: adds the regression status of the "
            "energy/variance-compare runs (names relative to each RUN_DIR).",
        ),
    ] = None,
    as_json: JsonOption = False,
) -> None:
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
    from otb_diag.pipelines.report.recipe import write_report

    result = write_report(run_dirs, out, golden)
    if as_json:
        print_json(result.to_json())
    else:
        typer.echo(result.format())
