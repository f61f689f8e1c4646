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
    scenario: Annotated[
        str,
        typer.Option(
            "--scenario",
            help="default: copy / reverse / sort of 3-40 digits (about 4 min on 2 cores). "
            "long: running sums of 3-52 digits with a scratchpad (about 20 min).",
        ),
    ] = "default",
) -> None:
    """Rebuild a toy lab deterministically: a character-level tokenizer, a small GPT-2-style
    model trained by SFT on the scenario's task, checkpoints along the run, and rollouts sampled
    from the final checkpoint and scored by the verifier. The default scenario: copy / reverse /
    sort of digit strings (3 to 40 digits), with single-turn and multi-turn tool-use rollouts.
    The long scenario: a running sum of 3 to 52 labelled digits written out line by line
    (responses of 20 to about 350 tokens), 16 prompts x 128 responses. The shipped labs are
    `--seed 0`.

    Example: otb-diag lab build --scenario long --out ./long-lab --seed 0
    """
    from otb_diag.io.scenarios import check_scenario
    from otb_diag.lab.build import SCENARIOS, build_lab

    config = SCENARIOS[check_scenario(scenario)]
    manifest = build_lab(out, seed=seed, config=config, progress=not quiet)
    print_json(manifest)
