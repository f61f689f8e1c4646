"""What every subcommand shares: turning bad input into one paragraph and a non-zero exit (and
any other failure into one paragraph, a saved traceback and exit 3, and Ctrl-C into one
paragraph and exit 130), notes on stderr and the summary printed as text or JSON. What is
printed on stderr starts on its own line: a progress bar still drawn is closed first."""

from __future__ import annotations

import functools
import os
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from typing import Any, TypeVar

import click
import typer

from otb_diag.errors import InputError, Interrupted
from otb_diag.io.atomic import json_text
from otb_diag.runtime.torchrun import DistributedError

F = TypeVar("F", bound=Callable[..., Any])

EXIT_BAD_INPUT = 2
EXIT_FAULT = 1
EXIT_INTERNAL = 3
EXIT_INTERRUPTED = 130  # 128 + SIGINT, as shells report a program Ctrl-C stopped
# `otb-diag --debug ...` (or OTB_DIAG_DEBUG=1) lets unexpected exceptions through with their
# traceback instead of the one-paragraph report.
DEBUG_ENV = "OTB_DIAG_DEBUG"
REPORT_URL = "the otb-diag issue tracker"


def _debug_enabled() -> bool:
    return os.environ.get(DEBUG_ENV, "") not in ("", "0")


def friendly_errors(fn: F) -> F:
    """Print an `InputError` as `otb-diag: error: ...` on stderr and exit 2, with no traceback.
    Under torchrun every rank raises the same error (`Dist.checked` shares a rank's own), so
    rank 0 alone prints it; a failed or lost rank (`DistributedError`) exits 1, said by every
    surviving rank. Any other exception is one paragraph naming what failed and a file holding
    the full traceback, exit 3 (with --debug the exception propagates, traceback and all).
    Ctrl-C is one paragraph, what was kept and how to go on where the command says
    (`errors.py:Interrupted`), exit 130. Click's own exits pass through."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except InputError as err:
            if _is_rank_zero():
                _echo_err(f"otb-diag: error: {err}")
            raise typer.Exit(EXIT_BAD_INPUT) from None
        except DistributedError as err:
            _echo_err(f"otb-diag: error: {err}")
            raise typer.Exit(EXIT_FAULT) from None
        except KeyboardInterrupt as err:
            if _is_rank_zero():
                kept = f" {err}" if isinstance(err, Interrupted) else ""
                _echo_err(f"otb-diag: interrupted (Ctrl-C).{kept}")
            raise typer.Exit(EXIT_INTERRUPTED) from None
        except (typer.Exit, typer.Abort, click.exceptions.Exit, click.ClickException, click.Abort):
            raise
        except Exception as err:
            if _debug_enabled():
                raise
            _echo_err(_internal_error_report(fn.__name__, err))
            raise typer.Exit(EXIT_INTERNAL) from None

    return wrapper  # type: ignore[return-value]


def _internal_error_report(command: str, err: BaseException) -> str:
    """One paragraph for an unexpected exception: what failed, where the full traceback was
    saved (a new file in the temporary directory) and how to report it."""
    text = "".join(traceback.format_exception(type(err), err, err.__traceback__))
    try:
        fd, name = tempfile.mkstemp(
            prefix=f"otb-diag-{command}-{time.strftime('%Y%m%d-%H%M%S')}-", suffix=".txt"
        )
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
        saved = f"the full traceback is in {name}"
    except OSError as save_err:
        saved = f"the traceback could not be saved ({save_err})"
    summary = f"{type(err).__name__}: {err}".splitlines()[0][:300]
    return (
        f"otb-diag: internal error: '{command.replace('_', '-')}' failed unexpectedly "
        f"({summary}); {saved}. This is a bug in otb-diag, not in your input: please report "
        f"it on {REPORT_URL} with that file and the command line you ran; "
        f"`otb-diag --debug ...` (or {DEBUG_ENV}=1) shows the traceback here."
    )


def note(message: str) -> None:
    """Informational line on stderr, so stdout stays clean for `--json` (under torchrun by
    rank 0 only); above the progress bars being drawn, never inside their line."""
    if _is_rank_zero():
        bars = _live_bars()
        if bars:
            bars[0].write(message, file=sys.stderr)  # clears the bars, prints, redraws them
        else:
            typer.echo(message, err=True)


def _live_bars() -> list[Any]:
    """The tqdm progress bars being drawn (none when tqdm was never imported)."""
    std = sys.modules.get("tqdm.std")
    return list(getattr(std.tqdm, "_instances", ())) if std is not None else []


def _echo_err(message: str) -> None:
    """A paragraph that ends the command, on its own line: the bars still drawn (the command
    stopped inside their loop) are closed first, each ending its line."""
    for bar in _live_bars():
        bar.close()
    typer.echo(message, err=True)


def _is_rank_zero() -> bool:
    return os.environ.get("RANK", "0") == "0"


def show(result: Any, as_json: bool, **how: Any) -> None:
    """A command's typed result on stdout: `result.to_json()` with --json, else
    `result.format(**how)` (`how`: what the text needs beyond the result, such as the output
    folder). Nothing for None: an entry point's result on a rank other than 0 under torchrun,
    where rank 0 prints."""
    if result is None:
        return
    typer.echo(json_text(result.to_json()) if as_json else result.format(**how))
