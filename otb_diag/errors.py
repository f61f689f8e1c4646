"""One error type for bad user input, so the CLI can print it as one paragraph and exit non-zero."""

from __future__ import annotations

import json
from pathlib import Path


class InputError(Exception):
    """Bad input from the user: names the file, the line or row, and the field.

    `line` is 1-based for JSONL files (the text line) and 0-based for Parquet rows (`row`);
    `where` overrides both with free text (for example "checkpoint directory").
    """

    def __init__(
        self,
        message: str,
        *,
        path: str | Path | None = None,
        line: int | None = None,
        row: int | None = None,
        field: str | None = None,
        hint: str | None = None,
    ) -> None:
        self.message = message
        self.path = Path(path) if path is not None else None
        self.line = line
        self.row = row
        self.field = field
        self.hint = hint
        super().__init__(str(self))

    def __str__(self) -> str:
        where = []
        if self.path is not None:
            where.append(str(self.path))
        if self.line is not None:
            where.append(f"line {self.line}")
        if self.row is not None:
            where.append(f"row {self.row}")
        if self.field is not None:
            where.append(f"field '{self.field}'")
        text = (", ".join(where) + ": " if where else "") + self.message
        return with_hint(text, self.hint)


def with_hint(text: str, hint: str | None) -> str:
    """`text`, then `hint` as the next sentence: `text` ends with a full stop first."""
    if not hint:
        return text
    return text + ("" if text.endswith((".", "!", "?")) else ".") + " " + hint


class Interrupted(KeyboardInterrupt):
    """Ctrl-C during a command that keeps what it finished: the message says what was kept
    and how to go on (`rollouts sample --resume`), printed as one paragraph, exit 130."""


def json_problem(err: json.JSONDecodeError) -> str:
    """A JSON parser's complaint and its column as one phrase: "Expecting ',' delimiter at
    column 6", "Unterminated string starting at column 315" (a message that ends in "at" says
    where itself)."""
    return f"{err.msg.removesuffix(' at')} at column {err.colno}"
