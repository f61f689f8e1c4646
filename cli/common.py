"""What every subcommand shares: turning bad input into one paragraph and a non-zero exit,
and saying out loud when the embedded default stands in for an omitted option."""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import typer

from otb_diag.errors import InputError

F = TypeVar("F", bound=Callable[..., Any])

EXIT_BAD_INPUT = 2


def friendly_errors(fn: F) -> F:
    """Print an `InputError` as `otb-diag: error: ...` on stderr and exit 2, with no traceback."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except InputError as err:
            typer.echo(f"otb-diag: error: {err}", err=True)
            raise typer.Exit(EXIT_BAD_INPUT) from None

    return wrapper  # type: ignore[return-value]


def note(message: str) -> None:
    """Informational line on stderr, so stdout stays clean for `--json`."""
    typer.echo(message, err=True)


def or_default(value: Path | None, default: Path, what: str) -> Path:
    """`value`, or the embedded default with a note saying it was used."""
    if value is not None:
        return value
    note(f"no {what} given: using the embedded default {default}")
    return default


def print_json(data: Any) -> None:
    typer.echo(json.dumps(data, indent=2, sort_keys=False))
