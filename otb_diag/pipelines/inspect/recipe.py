"""What `otb-diag rollouts inspect` reports: the first things to check in rollouts.

`inspect_rollouts` streams the rollout files through the index pass
(`otb_diag/io/rollouts/stream.py:index_rollouts`, one row at a time: memory is set by a row and
the index, not the files), tokenizes text-only rows and checks ids against a checkpoint's
vocabulary when asked, and summarizes the per-row facts of `facts.RowFacts`; `summarize` does
the same for `Rollouts` already in memory. `format_summary` renders the summary for the terminal
(pure).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

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
from otb_diag.pipelines.inspect.facts import FIELDS, RowFacts
from otb_diag.runtime.torchrun import session

__all__ = ["FIELDS", "format_summary", "inspect_rollouts", "summarize"]  # FIELDS: where it was

# Loads a checkpoint's tokenizer: (tokenizer, vocabulary size).
TokenizerLoader = Callable[[], tuple[TextTokenizer, int]]


def summarize(rollouts: Rollouts) -> dict[str, Any]:
    """The summary (see `RowFacts.summary`) of responses already read and tokenized."""
    facts = RowFacts()
    for r in rollouts.responses:
        facts.add(r)
    return facts.summary(rollouts)


@dataclass(frozen=True)
class Inspected:
    """What `inspect_rollouts` finds: the summary, the texts that do not round-trip through the
    tokenizer, and the text prompts tokenized without the tokenizer's chat template."""

    summary: dict[str, Any]
    issues: list[RoundTripIssue]
    untemplated: int


def inspect_rollouts(
    path: Path,
    load_tokenizer: TokenizerLoader,
    always_tokenizer: bool,
    *,
    steps: str | None = None,
    reward_columns: list[str] | None = None,
    chat_template: bool = False,
) -> Inspected | None:
    """Stream the rollouts (a file, a directory or a glob; rows with a step in `steps`, "A-B")
    once: validate every row, fill in missing ids with the tokenizer (loaded on the first row
    without ids, or up front when `always_tokenizer`), check the ids against its vocabulary, and
    summarize.

    Under torchrun rank 0 reads the rollouts and the other ranks wait for its outcome (its error
    stops them too); they return None, and the output is one process's.
    """
    with session("cpu") as d:
        return d.on_main(
            lambda: _inspect(
                path, load_tokenizer, always_tokenizer, steps, reward_columns, chat_template
            )
        )


def _inspect(
    path: Path,
    load_tokenizer: TokenizerLoader,
    always_tokenizer: bool,
    steps: str | None,
    reward_columns: list[str] | None,
    chat_template: bool,
) -> Inspected:
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

    index = index_rollouts(path, steps=steps, reward_columns=reward_columns, on_row=add)
    return Inspected(facts.summary(index.shell), issues, untemplated)


def format_summary(summary: dict[str, Any]) -> str:
    """A compact, aligned block of text for the terminal."""
    s = summary
    sizes = s["group_size"]
    lines = [
        ("rollouts", f"{s['path']} ({s['format']})"),
        ("rows", str(s["rows"])),
        (
            "groups",
            f"{s['groups']}; size min {_n(sizes['min'])}, median {_n(sizes['median'])}, "
            f"max {_n(sizes['max'])} ("
            + ", ".join(f"{n} of size {size}" for size, n in sizes["counts"].items())
            + ")",
        ),
        ("groups of one", _ids(s["singleton_groups"])),
    ]
    tokens = s["response_tokens"]
    lines.append(
        (
            "response tokens",
            "unknown (no token ids: give a checkpoint to tokenize the text)"
            if tokens is None
            else ", ".join(
                f"{name} {_n(tokens[name])}"
                for name in ("min", "p10", "median", "p90", "max", "mean")
            )
            + f"; max/min {_n(tokens['max_over_min'])}",
        )
    )
    lines += _reward_lines(s)
    masked = s["masked_tokens"]
    lines.append(
        (
            "masked tokens",
            "unknown (no token ids)"
            if masked is None
            else f"{masked['count']} of {masked['of']} ({_pct(masked['share'])})",
        )
    )
    lines.append(("temperatures", ", ".join(_n(t) for t in s["temperatures"])))
    steps = s["steps"]
    lines.append(
        ("steps", f"{len(steps)} ({steps[0]} to {steps[-1]})" if steps else "none recorded")
    )
    rows = s["rows"]
    lines.append(
        (
            "fields present",
            ", ".join(
                name if n == rows else f"{name} ({n}/{rows})"
                for name, n in s["fields_present"].items()
                if n
            ),
        )
    )
    width = max(len(label) for label, _ in lines)
    return "\n".join(f"{label:<{width}}  {value}" for label, value in lines)


def _reward_lines(s: dict[str, Any]) -> list[tuple[str, str]]:
    """The reward, its values, the per-group means and the all-equal groups, labelled."""
    reward = s["reward"]
    uniform = s["uniform_groups"]
    lines = []
    reward_line = ", ".join(f"{k} {_n(reward[k])}" for k in ("mean", "std", "min", "max"))
    if reward["binary"]:
        reward_line += f"; binary: {_pct(reward['share_one'])} are 1"
    lines.append(("reward", reward_line))
    if reward["histogram"] is not None:
        lines.append(
            ("reward values", ", ".join(f"{v}: {n}" for v, n in reward["histogram"].items()))
        )
    lines.append(
        (
            "pass rate / group" if reward["binary"] else "mean reward / group",
            ", ".join(f"{k} {_n(v)}" for k, v in s["group_mean_reward"].items()),
        )
    )
    lines.append(
        (
            "all-equal groups",
            "no groups of two or more"
            if uniform["share"] is None
            else f"{uniform['count']} of {uniform['of']} ({_pct(uniform['share'])})"
            + "".join(f"; reward {v}: {n}" for v, n in uniform["by_value"].items())
            + (" (no signal under a group baseline)" if uniform["count"] else ""),
        )
    )
    return lines


def _n(x: float) -> str:
    """A number without trailing noise: 4.0 -> "4", 0.123456 -> "0.1235"."""
    return f"{x:.4g}"


def _pct(share: float) -> str:
    return f"{100 * share:.1f}%"


def _ids(ids: list[str], shown: int = 5) -> str:
    if not ids:
        return "none"
    more = f", ... (+{len(ids) - shown} more)" if len(ids) > shown else ""
    return f"{len(ids)}: " + ", ".join(ids[:shown]) + more
