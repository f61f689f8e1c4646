"""`otb-diag lab`: the embedded toy lab (task, tokenizer, model, SFT run, rollouts)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import typer
from otb_diag.cli.common import show
from otb_diag.cli.options import JSON, OUT_DIR, QUIET, command, register

from otb_diag.knobs import Checked, knob
from otb_diag.pipelines.inputs import LabInputs
from otb_diag.pipelines.lab_settings import LabSettings

app = typer.Typer(
    rich_markup_mode=None,  # reflow docstring paragraphs to the terminal's width
    no_args_is_help=True,
    help="Build the embedded toy lab.\n\nExample: otb-diag lab build --out ./toy-lab --seed 0",
)


@dataclass(frozen=True)
class BuildRun(Checked):
    out: Path = knob(spec=OUT_DIR)
    inputs: LabInputs = LabInputs()  # --scenario
    quiet: bool = knob(False, QUIET)
    as_json: bool = knob(False, JSON)


@command
def build(run: BuildRun, settings: LabSettings) -> None:
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
    from otb_diag.pipelines.lab_build import run_lab_build

    show(run_lab_build(run.inputs, run.out, settings, progress=not run.quiet), run.as_json)


register(app, "build", build)
