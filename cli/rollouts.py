"""`otb-diag rollouts`: read, validate and summarise a rollouts file."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
from otb_diag.cli.common import (
    ChatTemplateOption,
    CkptOption,
    JsonOption,
    RemoteCodeOption,
    RewardColumnOption,
    RolloutsOption,
    ScenarioOption,
    StepsOption,
    friendly_errors,
    note,
    one_checkpoint,
    one_rollouts,
    or_default,
    print_json,
)

app = typer.Typer(
    rich_markup_mode=None,  # reflow docstring paragraphs to the terminal's width
    no_args_is_help=True,
    help="Read, validate and summarise rollouts.\n\n"
    "Example: otb-diag rollouts inspect rollouts.jsonl --ckpt ./checkpoint-200",
)


@app.command("inspect")
@friendly_errors
def inspect(
    file: Annotated[
        Path | None,
        typer.Argument(
            metavar="PATH",
            help="Rollouts, as --rollouts (an alias: give either form).",
        ),
    ] = None,
    rollouts: RolloutsOption = None,
    ckpt: CkptOption = None,
    as_json: JsonOption = False,
    trust_remote_code: RemoteCodeOption = False,
    steps: StepsOption = None,
    reward_column: RewardColumnOption = None,
    chat_template: ChatTemplateOption = False,
    scenario: ScenarioOption = "default",
) -> None:
    """What to check first in a rollouts file: rows, groups and their sizes, response lengths,
    rewards, the share of groups whose rewards are all equal (no signal under a group baseline)
    and the share of masked (tool-output) tokens. Every row is validated; bad input stops with the
    file, line and field. --ckpt (one; its tokenizer tokenizes text-only rows and its vocabulary
    bounds the token ids) defaults to the embedded checkpoint when one is needed.

    Example: otb-diag rollouts inspect rollouts.jsonl --ckpt ./checkpoint-200 --json

    (the same: otb-diag rollouts inspect --rollouts rollouts.jsonl --ckpt ./checkpoint-200 --json)
    """
    from otb_diag.io.scenarios import default_checkpoint, default_rollouts
    from otb_diag.pipelines.inspect.recipe import format_summary, inspect_rollouts

    given_ckpt = one_checkpoint(ckpt, "inspect reads one tokenizer")
    given_rollouts = one_rollouts(file, rollouts)

    def tokenizer() -> tuple[Any, int]:
        from otb_diag.io.checkpoint import load_tokenizer

        ckpt_dir = or_default(given_ckpt, lambda: default_checkpoint(scenario), "checkpoint")
        return load_tokenizer(ckpt_dir, trust_remote_code=trust_remote_code)

    path = or_default(given_rollouts, lambda: default_rollouts(scenario), "rollouts file")
    result = inspect_rollouts(
        path,
        tokenizer,
        always_tokenizer=given_ckpt is not None or given_rollouts is None,
        steps=steps,
        reward_columns=reward_column,
        chat_template=chat_template,
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
    if as_json:
        print_json(summary)
        return
    typer.echo(format_summary(summary))
    for issue in issues[:10]:
        note(f"round trip: {issue}")
    if len(issues) > 10:
        note(f"... and {len(issues) - 10} more rows whose text does not round-trip")
