"""`otb-diag`: the Typer app. Parses options, calls `otb_diag`, prints and writes; no maths here.

Heavy imports (torch, transformers) happen inside the commands so `--help` stays instant; only
the help of an option listing a registry's names (or taking its default) imports it, when shown."""

from __future__ import annotations

import os
from typing import Annotated

import typer
from otb_diag.cli import (
    dynamics,
    energy,
    figures,
    lab,
    regress,
    report,
    rollouts,
    train,
    variance,
)
from otb_diag.cli.common import DEBUG_ENV
from otb_diag.cli.options import register

from otb_diag.runtime.library_logs import logs_to_stderr
from otb_diag.runtime.threads import calm_waits

app = typer.Typer(
    rich_markup_mode=None,  # reflow docstring paragraphs to the terminal's width
    name="otb-diag",
    help=(
        "Gradient-variance diagnostics for RL of language models: realized energy, the Optimal "
        "Token Baseline and the variance of the policy gradient, on your checkpoint and rollouts "
        "or on the embedded toy default.\n\n"
        "Example: otb-diag rollouts inspect my_rollouts.jsonl --ckpt ./checkpoint-200"
    ),
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
app.add_typer(rollouts.app, name="rollouts")
app.add_typer(lab.app, name="lab")
register(app, "energy", energy.energy)
register(app, "variance-compare", variance.variance_compare)
register(app, "figures", figures.figures)
register(app, "regress", regress.regress)
register(app, "dynamics", dynamics.dynamics)
register(app, "train", train.train)
register(app, "report", report.report)


def _version(value: bool) -> None:
    if value:
        from otb_diag import __version__

        typer.echo(f"otb-diag {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[
        bool,
        typer.Option(
            "--version", callback=_version, is_eager=True, help="Print the version and exit."
        ),
    ] = False,
    debug: Annotated[
        bool,
        typer.Option(
            "--debug",
            help="Show the full traceback of an unexpected error instead of the short report.",
        ),
    ] = False,
) -> None:
    """Gradient-variance diagnostics for RL of language models."""
    logs_to_stderr()  # stdout holds the command's output only (otb_diag/runtime/library_logs.py)
    if debug:
        os.environ[DEBUG_ENV] = "1"


def main() -> None:
    calm_waits(os.environ)  # before anything imports torch (otb_diag/runtime/threads.py)
    app()


if __name__ == "__main__":
    main()
