"""`otb-diag rollouts`: read, validate and summarise a rollouts file."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import typer
from otb_diag.cli.common import note, show
from otb_diag.cli.options import CKPT, JSON, OUT_DIR, QUIET, ROLLOUTS, command, register

from otb_diag.io.scenarios import scenario_knob
from otb_diag.knobs import Checked, knob
from otb_diag.pipelines.inputs import Inputs, SampleInputs, one_rollouts
from otb_diag.pipelines.inspect.settings import InspectSettings
from otb_diag.pipelines.sample.settings import SampleSettings
from otb_diag.runtime.threads import THREADS

app = typer.Typer(
    rich_markup_mode=None,  # reflow docstring paragraphs to the terminal's width
    no_args_is_help=True,
    help="Sample pools from a checkpoint; read, validate and summarise rollouts.\n\n"
    "Example: otb-diag rollouts inspect rollouts.jsonl --ckpt ./checkpoint-200",
)


@dataclass(frozen=True)
class InspectRun(Checked):
    file: Path | None = knob(
        None,
        argument=True,
        metavar="PATH",
        help="Rollouts, as --rollouts (an alias: give either form).",
    )
    rollouts: Path | None = knob(None, ROLLOUTS)
    ckpt: list[Path] | None = knob(None, CKPT)
    as_json: bool = knob(False, JSON)
    settings: InspectSettings = InspectSettings()  # of its load options: a tokenizer's
    scenario: str = scenario_knob()

    @property
    def inputs(self) -> Inputs:
        """The files given, the positional rollouts and --rollouts read as one option."""
        rollouts = one_rollouts(self.file, self.rollouts)
        return Inputs(ckpt=self.ckpt, rollouts=rollouts, scenario=self.scenario)


SKIPPED = ("device", "dtype", "allow_pickle", "device_map")


@command(skip=tuple(f"settings.load.{name}" for name in SKIPPED))
def inspect(run: InspectRun) -> None:
    """What to check first in a rollouts file: rows, groups and their sizes, response lengths,
    rewards, the share of groups whose rewards are all equal (no signal under a group baseline)
    and the share of masked (tool-output) tokens. Every row is validated; bad input stops with the
    file, line and field. --ckpt (one; its tokenizer tokenizes text-only rows and its vocabulary
    bounds the token ids) defaults to the embedded checkpoint when one is needed.

    Example: otb-diag rollouts inspect rollouts.jsonl --ckpt ./checkpoint-200 --json

    (the same: otb-diag rollouts inspect --rollouts rollouts.jsonl --ckpt ./checkpoint-200 --json)
    """
    from otb_diag.pipelines.inspect.recipe import run_inspect

    result = run_inspect(run.inputs, run.settings, say=note)
    show(result, run.as_json)


register(app, "inspect", inspect)


@dataclass(frozen=True)
class SampleRun(Checked):
    prompts: Path = knob(
        metavar="FILE",
        help="Prompts: JSONL, Parquet, CSV, or a datasets save_to_disk directory; a prompt is "
        "text or a list of chat messages.",
    )
    out: Path = knob(spec=OUT_DIR)
    ckpt: list[Path] | None = knob(None, CKPT)
    quiet: bool = knob(False, QUIET)
    as_json: bool = knob(False, JSON)
    threads: int | None = knob(None, THREADS)  # None: auto

    @property
    def inputs(self) -> SampleInputs:
        return SampleInputs(self.prompts, self.ckpt)


@command(skip=("load.chat_template", "load.device_map"))
def sample(run: SampleRun, settings: SampleSettings) -> None:
    """Sample pools of --n responses per prompt from a checkpoint (a Hugging Face directory or a
    .gguf file), score them with a verifier and write them in the rollout format: OUT/rollouts.jsonl
    (one group per prompt, exact prompt_ids and response_ids, EOS kept, a truncated flag, and
    per-token logprobs and sum_pi2 under softmax(z/τ)) and OUT/manifest.json (every setting).
    energy, variance-compare and rollouts inspect read OUT as it is. Pools of M ≥ 64 let
    variance-compare measure N′ up to 32. Each response is a function of (--seed, prompt,
    index): a killed run finished with --resume writes exactly the pools of an uninterrupted one.
    Under torchrun the ranks split the prompts and write the pools of one process.

    Example: otb-diag rollouts sample --ckpt ./checkpoint-200 --prompts prompts.jsonl --n 64
    --max-new-tokens 128 --verifier math --out pools/
    """
    from otb_diag.pipelines.sample.recipe import run_sample

    result = run_sample(run.inputs, run.out, settings, progress=not run.quiet, say=note)
    show(result, run.as_json, out=run.out)


register(app, "sample", sample)
