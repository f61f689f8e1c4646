"""`otb-diag rollouts`: read, validate and summarise a rollouts file."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import typer
from otb_diag.cli.common import note, show
from otb_diag.cli.options import CKPT, JSON, OUT_DIR, QUIET, ROLLOUTS, command, register

from otb_diag.io.load_options import LoadOptions
from otb_diag.io.scenarios import scenario_knob
from otb_diag.knobs import knob
from otb_diag.pipelines.measure_knobs import REWARD_COLUMNS, STEPS
from otb_diag.pipelines.sample.settings import SampleSettings

app = typer.Typer(
    rich_markup_mode=None,  # reflow docstring paragraphs to the terminal's width
    no_args_is_help=True,
    help="Sample pools from a checkpoint; read, validate and summarise rollouts.\n\n"
    "Example: otb-diag rollouts inspect rollouts.jsonl --ckpt ./checkpoint-200",
)


@dataclass(frozen=True)
class InspectRun:
    file: Path | None = knob(
        None,
        argument=True,
        metavar="PATH",
        help="Rollouts, as --rollouts (an alias: give either form).",
    )
    rollouts: Path | None = knob(None, ROLLOUTS)
    ckpt: list[Path] | None = knob(None, CKPT)
    as_json: bool = knob(False, JSON)
    load: LoadOptions = LoadOptions()  # --trust-remote-code and --chat-template
    steps: str | None = knob(None, STEPS)
    reward_columns: tuple[str, ...] | None = knob(None, REWARD_COLUMNS)
    scenario: str = scenario_knob()


@command(skip=("load.device", "load.dtype", "load.allow_pickle", "load.device_map"))
def inspect(run: InspectRun) -> None:
    """What to check first in a rollouts file: rows, groups and their sizes, response lengths,
    rewards, the share of groups whose rewards are all equal (no signal under a group baseline)
    and the share of masked (tool-output) tokens. Every row is validated; bad input stops with the
    file, line and field. --ckpt (one; its tokenizer tokenizes text-only rows and its vocabulary
    bounds the token ids) defaults to the embedded checkpoint when one is needed.

    Example: otb-diag rollouts inspect rollouts.jsonl --ckpt ./checkpoint-200 --json

    (the same: otb-diag rollouts inspect --rollouts rollouts.jsonl --ckpt ./checkpoint-200 --json)
    """
    from otb_diag.pipelines.inputs import (
        checkpoint_or_default,
        one_checkpoint,
        one_rollouts,
        rollouts_or_default,
    )
    from otb_diag.pipelines.inspect.recipe import format_summary, inspect_rollouts

    given_ckpt = one_checkpoint(run.ckpt, "inspect reads one tokenizer")
    given_rollouts = one_rollouts(run.file, run.rollouts)

    def tokenizer() -> tuple[Any, int]:
        from otb_diag.io.checkpoint import load_tokenizer

        ckpt_dir = checkpoint_or_default(given_ckpt, run.scenario, note, "checkpoint")
        return load_tokenizer(ckpt_dir, trust_remote_code=run.load.trust_remote_code)

    path = rollouts_or_default(given_rollouts, run.scenario, note, "rollouts file")
    result = inspect_rollouts(
        path,
        tokenizer,
        always_tokenizer=given_ckpt is not None or given_rollouts is None,
        steps=run.steps,
        reward_columns=list(run.reward_columns) if run.reward_columns else None,
        chat_template=run.load.chat_template,
    )
    if result is None:  # a rank other than 0 under torchrun: rank 0 prints
        return
    summary, issues = result.summary, result.issues
    if result.untemplated:
        note(
            f"note: {result.untemplated} prompts were tokenized without the tokenizer's chat "
            "template; pass --chat-template if the trainer applied it"
        )
    summary["round_trip_issues"] = [str(issue) for issue in issues]
    show(summary, run.as_json, lambda: format_summary(summary))
    if run.as_json:
        return
    for issue in issues[:10]:
        note(f"round trip: {issue}")
    if len(issues) > 10:
        note(f"... and {len(issues) - 10} more rows whose text does not round-trip")


register(app, "inspect", inspect)


@dataclass(frozen=True)
class SampleRun:
    prompts: Path = knob(
        metavar="FILE",
        help="Prompts: JSONL, Parquet, CSV, or a datasets save_to_disk directory; a prompt is "
        "text or a list of chat messages.",
    )
    out: Path = knob(spec=OUT_DIR)
    ckpt: list[Path] | None = knob(None, CKPT)
    resume: bool = knob(False, help="Finish a killed run into the same --out.")
    quiet: bool = knob(False, QUIET)
    as_json: bool = knob(False, JSON)


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
    from otb_diag.pipelines.inputs import checkpoint_or_default, one_checkpoint
    from otb_diag.pipelines.sample.recipe import format_manifest, run_sample

    given = one_checkpoint(run.ckpt, "sample draws from one policy")
    path = checkpoint_or_default(given, "default", note)
    manifest = run_sample(
        path, run.prompts, run.out, settings, resume=run.resume, progress=not run.quiet, say=note
    )
    if manifest is None:  # a rank other than 0 under torchrun: rank 0 reports
        return
    show(manifest, run.as_json, lambda: format_manifest(manifest, run.out))


register(app, "sample", sample)
