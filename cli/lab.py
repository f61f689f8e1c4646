"""`otb-diag lab`: the embedded toy lab (task, tokenizer, model, SFT run, rollouts)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
from otb_diag.cli.common import (
    JsonOption,
    OutOption,
    QuietOption,
    ScenarioOption,
    friendly_errors,
    print_json,
)

app = typer.Typer(
    rich_markup_mode=None,  # reflow docstring paragraphs to the terminal's width
    no_args_is_help=True,
    help="Build the embedded toy lab.\n\nExample: otb-diag lab build --out ./toy-lab --seed 0",
)


@app.command("build")
@friendly_errors
def build(
    out: OutOption,
    seed: Annotated[
        int, typer.Option("--seed", help="Seed of every random draw: same seed, same lab.")
    ] = 0,
    quiet: QuietOption = False,
    scenario: ScenarioOption = "default",
    as_json: JsonOption = False,
) -> None:
    """Rebuild a toy lab deterministically: a character-level tokenizer, a small GPT-2-style
    model trained by SFT on the scenario's task, checkpoints along the run, and rollouts sampled
    from the final checkpoint and scored by the verifier. The default scenario: copy / reverse /
    sort of digit strings (3 to 40 digits), with single-turn and multi-turn tool-use rollouts.
    The long scenario: a running sum of 3 to 52 labelled digits written out line by line
    (responses of 20 to 400 tokens), 16 prompts x 128 responses. The shipped labs are
    `--seed 0`. The default scenario takes about 4 min on 2 cores, the long one about 20 min.
    Prints what was built (lab.json's content with --json).

    Example: otb-diag lab build --scenario long --out ./long-lab --seed 0
    """
    from otb_diag.io.scenarios import check_scenario
    from otb_diag.lab.build import SCENARIOS, build_lab

    config = SCENARIOS[check_scenario(scenario)]
    manifest = build_lab(out, seed=seed, config=config, progress=not quiet)
    if as_json:
        print_json(manifest)
    else:
        typer.echo(format_lab(manifest, out))


def format_lab(manifest: dict[str, Any], out: Path) -> str:
    """The short text `lab build` prints: parameters, checkpoints, rollouts, time."""
    steps = ", ".join(str(c["step"]) for c in manifest["checkpoints"])
    lines = [
        f"built a {manifest['n_params']:,}-parameter lab in {out} (seed {manifest['seed']})",
        f"checkpoints  steps {steps}",
    ]
    for key in ("rollouts", "rollouts_tir"):
        if key in manifest:
            lines.append(f"{key:<12} {_group_line(manifest[key])}")
    took = manifest["timings"].get("total_s", 0)
    lines.append(f"took         {took:.0f} s; lab.json holds it all")
    return "\n".join(lines)


def _group_line(stats: dict[str, Any]) -> str:
    tokens = stats["response_tokens"]
    return (
        f"{stats['rows']} rows in {stats['groups']} groups ({stats['mixed_groups']} with mixed "
        f"rewards), mean reward {stats['mean_reward']:.3f}, responses of {tokens['min']}-"
        f"{tokens['max']} tokens"
    )
