"""What `otb-diag rollouts inspect` reports: the first things to check in rollouts.

`run_inspect`, the command's entry point, resolves its inputs (the embedded scenario's
rollouts and checkpoint when none are given, said through `say`), streams the rollout files
through the index pass (`otb_diag/io/rollouts/stream.py:index_rollouts`, one row at a time:
memory is set by a row and the index, not the files), tokenizes text-only rows and checks ids
against a checkpoint's vocabulary when asked, and summarizes the per-row facts of
`facts.RowFacts` as an `InspectResult`; `summarize` does the same for `Rollouts` already in
memory.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from otb_diag.io.rollouts.readers import Rollouts
from otb_diag.io.rollouts.rows import Response
from otb_diag.io.rollouts.stream import index_rollouts
from otb_diag.io.rollouts.tokenize import (
    RoundTripIssue,
    TextTokenizer,
    check_vocab,
    prompts_without_template,
    tokenize_rollouts,
)
from otb_diag.pipelines.inputs import (
    Inputs,
    Say,
    checkpoint_or_default,
    one_checkpoint,
    rollouts_or_default,
    silent,
)
from otb_diag.pipelines.inspect.facts import FIELDS, RowFacts
from otb_diag.pipelines.inspect.settings import InspectSettings
from otb_diag.pipelines.results.inspect import InspectResult
from otb_diag.pipelines.results.schema import groups_of_one
from otb_diag.pipelines.shell import Stage, run_recipe

__all__ = ["FIELDS", "run_inspect", "summarize"]  # FIELDS: where it was
# Loads a checkpoint's tokenizer: (tokenizer, vocabulary size).
_TokenizerLoader = Callable[[], tuple[TextTokenizer, int]]


def summarize(rollouts: Rollouts) -> InspectResult:
    """The summary (see `RowFacts.summary`) of responses already read and tokenized."""
    facts = RowFacts()
    for r in rollouts.responses:
        facts.add(r)
    return facts.summary(rollouts)


@dataclass(frozen=True)
class _Inspected:
    """What `_inspect` finds: the summary (with the texts that do not round-trip through the
    tokenizer), and the text prompts tokenized without the tokenizer's chat template."""

    summary: InspectResult
    untemplated: int


def run_inspect(
    inputs: Inputs, settings: InspectSettings = InspectSettings(), *, say: Say = silent
) -> InspectResult | None:
    """Stream the rollouts of `inputs` (a file, a directory or a glob; rows with a step in
    `settings.steps`, "A-B"; the scenario's embedded rollouts when none) once: validate every
    row, fill in missing ids with the tokenizer of its checkpoint (loaded on the first row
    without ids, or up front when a checkpoint is given or the rollouts are the embedded ones;
    the scenario's checkpoint when none; --ckpt must name at most one), check the ids against
    its vocabulary, and summarize. Says which defaults it used, how many prompts were tokenized
    without a chat template, and the rows whose text does not round-trip (also in the result's
    `round_trip_issues`).

    Under torchrun rank 0 reads the rollouts and the other ranks wait for its outcome (its error
    stops them too); they return None, and the output is one process's.
    """
    ckpt = one_checkpoint(inputs.ckpt, "inspect reads one tokenizer")
    path = rollouts_or_default(inputs.rollouts, inputs.scenario, say)
    always_tokenizer = ckpt is not None or inputs.rollouts is None

    def inspect(stage: Stage) -> _Inspected:
        def tokenizer() -> tuple[TextTokenizer, int]:
            from otb_diag.io.checkpoint import load_tokenizer  # torch: only when rows need it

            ckpt_dir = checkpoint_or_default(ckpt, inputs.scenario, stage.say)
            return load_tokenizer(ckpt_dir, trust_remote_code=settings.load.trust_remote_code)

        return _inspect(path, tokenizer, always_tokenizer, settings)

    found = run_recipe(inspect, every_rank=False, progress=False, say=say)
    if found is None:
        return None
    warning = groups_of_one(len(found.summary.singleton_groups), found.summary.groups)
    if warning:
        say(warning)
    if found.untemplated:
        say(
            f"note: {found.untemplated} prompts were tokenized without the tokenizer's chat "
            "template; pass --chat-template if the trainer applied it"
        )
    if found.summary.round_trip_issues:
        say(round_trip_line(found.summary.round_trip_issues))
    return found.summary


def round_trip_line(issues: list[str]) -> str:
    """One line for every text the tokenizer does not reproduce: their count and the first (a
    dump decoded by another tokenizer fails on every row and field, 48 lines for a 24-row verl
    dump; the whole list is the result's `round_trip_issues`, in --json)."""
    more = f"; {len(issues) - 1} more in --json" if len(issues) > 1 else ""
    count = f"{len(issues)} text field(s) not reproduced by the tokenizer"
    return f"round trip: {count}; first: {issues[0]}{more}"


def _inspect(
    path: Path, load_tokenizer: _TokenizerLoader, always_tokenizer: bool, settings: InspectSettings
) -> _Inspected:
    chat_template = settings.load.chat_template
    tokenizer: tuple[TextTokenizer, int] | None = None
    facts = RowFacts()
    issues: list[RoundTripIssue] = []
    untemplated = 0

    def add(row: tuple[int, Rollouts, Response]) -> None:
        nonlocal tokenizer, untemplated
        f, file, r = row
        if tokenizer is None and (
            always_tokenizer or r.response_ids is None or r.prompt_ids is None
        ):
            tokenizer = load_tokenizer()
        if tokenizer is not None:
            one = replace(file, responses=[r])
            if not chat_template:
                untemplated += prompts_without_template(one, tokenizer[0])
            one, found = tokenize_rollouts(one, tokenizer[0], chat_template=chat_template)
            check_vocab(one, tokenizer[1])
            issues.extend(found)
            r = one.responses[0]
        facts.add(r, f)

    reward_columns = list(settings.reward_columns) if settings.reward_columns else None
    index = index_rollouts(path, steps=settings.steps, reward_columns=reward_columns, on_row=add)
    summary = facts.summary(index.shell, [str(issue) for issue in issues])
    return _Inspected(summary, untemplated)
