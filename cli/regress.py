"""`otb-diag regress`: fail CI when the numbers of an energy/variance-compare run move."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from otb_diag.cli.common import JsonOption, friendly_errors, note, print_json

EXIT_REGRESSION = 1


@friendly_errors
def regress(
    golden: Annotated[
        Path, typer.Option("--golden", help="Golden JSON file (written by --update).")
    ],
    current: Annotated[
        Path,
        typer.Option(
            "--current",
            help="Run directory of `otb-diag energy` / `variance-compare`, or a directory "
            "holding several (metric names are prefixed with each run's sub-directory).",
        ),
    ],
    update: Annotated[
        bool,
        typer.Option("--update", help="Rewrite the golden file from --current; print changes."),
    ] = False,
    junit: Annotated[
        Path | None,
        typer.Option("--junit", help="Also write a JUnit XML report (one testcase per metric)."),
    ] = None,
    tolerances: Annotated[
        Path | None,
        typer.Option(
            "--tolerances",
            help='JSON {"fnmatch pattern": {"rel": .., "abs": ..}} for deterministic metrics; '
            "the last matching pattern wins. Default rel 1e-4, abs 1e-6.",
        ),
    ] = None,
    as_json: JsonOption = False,
    every: Annotated[
        bool, typer.Option("--all", help="Print every metric, not only the failing ones.")
    ] = False,
) -> None:
    """Compare a run's variance numbers with a golden file and exit 1 if any moved.

    Deterministic metrics (energies, variance proxies, advantage statistics, sequence energy,
    proxy fidelity) must agree within a relative/absolute tolerance; statistical ones from
    variance.csv (variance, ratio to mean, equivalent N, token savings, bias z) pass when the
    golden and current 95 % intervals overlap, so a reseeded run does not fail for noise.
    A metric missing from the run or absent from the golden file also fails.
    Exit status: 0 all pass (or --update), 1 regression, 2 bad input.

    Example:

        otb-diag energy --rollouts r.jsonl --out runs/energy

        otb-diag variance-compare --rollouts r.jsonl --out runs/variance

        otb-diag regress --golden golden.json --current runs --update   # once, then commit

        otb-diag regress --golden golden.json --current runs --junit report.xml
    """
    from otb_diag.pipelines.regress import recipe as lib
    from otb_diag.pipelines.regress.run_metrics import collect_metrics

    metrics = collect_metrics(current)
    if update:
        if junit is not None:
            note("--update compares nothing: no --junit report written")
        old = lib.load_golden(golden) if golden.exists() else None
        lib.write_golden(golden, metrics, lib.run_provenance(current))
        if old is None:
            typer.echo(f"created {golden} with {len(metrics)} metrics")
            return
        changes = lib.golden_changes(old, metrics)
        if changes:
            typer.echo(lib.format_changes(changes))
        typer.echo(f"updated {golden}: {len(metrics)} metrics, {len(changes)} changed")
        return

    rows = lib.compare(
        lib.load_golden(golden),
        metrics,
        lib.load_tolerances(tolerances) if tolerances is not None else (),
    )
    if junit is not None:
        lib.write_junit(junit, rows)
    if rows and all(r.status in ("missing", "extra") for r in rows):
        note(
            "no metric name in common: names carry the path below --current "
            "(energy/proxies/...), so point --current at the level the golden was made from"
        )
    if as_json:
        print_json({"counts": lib.counts(rows), "rows": [r.to_json() for r in rows]})
    else:
        typer.echo(lib.format_rows(rows, every=every))
    if any(r.status != "pass" for r in rows):
        raise typer.Exit(EXIT_REGRESSION)
