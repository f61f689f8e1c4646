"""`otb-diag figures`: regenerate the paper-style figure set from the embedded default."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from otb_diag.cli.common import JsonOption, QuietOption, friendly_errors, print_json


@friendly_errors
def figures(
    out: Annotated[Path, typer.Option("--out", help="Where the figures go.")] = Path("figures"),
    quick: Annotated[
        bool, typer.Option("--quick", help="Fewer steps and draws (a CI smoke run).")
    ] = False,
    seed: Annotated[int, typer.Option("--seed", help="Seed of every run.")] = 0,
    as_json: JsonOption = False,
    quiet: QuietOption = False,
) -> None:
    """Regenerate every figure from the embedded default: fig1–fig5, variance against N, ratio to
    the mean baseline, proxy fidelity, score against tokens sampled. Runs energy,
    variance-compare, four short toy trainings (mean N=4, mean N=16, otb N=4, optseq N=4; same
    seed) and dynamics; working outputs go under OUT/runs/, figures (PNG and PDF) into OUT/.

    Example: otb-diag figures --out figures/
    """
    from otb_diag.pipelines.figures import run_figures

    record = run_figures(out, quick=quick, seed=seed, progress=not quiet)
    if as_json:
        print_json(record)
    else:
        for name, command in record["figures"].items():
            typer.echo(f"{name:<36} {command}")
        typer.echo(f"wrote {len(record['figures'])} figures to {out}")
