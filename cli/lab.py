"""`otb-diag lab`: the embedded toy lab (task, tokenizer, model, SFT run, rollouts)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from otb_diag.cli.common import friendly_errors, print_json

app = typer.Typer(
    rich_markup_mode=None,  # reflow docstring paragraphs to the terminal's width
    no_args_is_help=True,
    help="Build the embedded toy lab.\n\nExample: otb-diag lab build --out ./toy-lab --seed 0",
)


@app.command("build")
@friendly_errors
def build(
    out: Annotated[Path, typer.Option("--out", help="Directory to write the lab into (created).")],
    seed: Annotated[
        int, typer.Option("--seed", help="Seed of every random draw: same seed, same lab.")
    ] = 0,
    quiet: Annotated[bool, typer.Option("--quiet", help="No progress bar.")] = False,
) -> None:
    """Rebuild the toy lab deterministically: a character-level tokenizer, a small GPT-2-style
    model trained by SFT on copy / reverse / sort of digit strings (3 to 40 digits), checkpoints
    along the run, and rollouts (single-turn and multi-turn tool use) sampled from the final
    checkpoint and scored by the verifier. The shipped default is `--seed 0`.

    Example: otb-diag lab build --out ./toy-lab --seed 0
    """
    from otb_diag.lab.build import build_lab

    manifest = build_lab(out, seed=seed, progress=not quiet)
    print_json(manifest)
