"""What every subcommand shares: turning bad input into one paragraph and a non-zero exit (and
any other failure into one paragraph, a saved traceback and exit 3), and saying out loud when the
embedded default stands in for an omitted option."""

from __future__ import annotations

import dataclasses
import functools
import inspect
import os
import tempfile
import time
import traceback
import typing
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, TypeVar

import click
import typer
from typer.core import TyperCommand

from otb_diag.errors import InputError
from otb_diag.io.atomic import json_text
from otb_diag.io.scenarios import scenario_knob
from otb_diag.knobs import KEY, Knob, knob
from otb_diag.runtime.torchrun import DistributedError

F = TypeVar("F", bound=Callable[..., Any])

EXIT_BAD_INPUT = 2
EXIT_FAULT = 1
EXIT_INTERNAL = 3
# `otb-diag --debug ...` (or OTB_DIAG_DEBUG=1) lets unexpected exceptions through with their
# traceback instead of the one-paragraph report.
DEBUG_ENV = "OTB_DIAG_DEBUG"
REPORT_URL = "the otb-diag issue tracker"


def debug_enabled() -> bool:
    return os.environ.get(DEBUG_ENV, "") not in ("", "0")


def friendly_errors(fn: F) -> F:
    """Print an `InputError` as `otb-diag: error: ...` on stderr and exit 2, with no traceback.
    Under torchrun every rank raises the same error (`Dist.checked` shares a rank's own), so
    rank 0 alone prints it; a failed or lost rank (`DistributedError`) exits 1, said by every
    surviving rank. Any other exception is one paragraph naming what failed and a file holding
    the full traceback, exit 3 (with --debug the exception propagates, traceback and all).
    Click's own exits pass through."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except InputError as err:
            if _is_rank_zero():
                typer.echo(f"otb-diag: error: {err}", err=True)
            raise typer.Exit(EXIT_BAD_INPUT) from None
        except DistributedError as err:
            typer.echo(f"otb-diag: error: {err}", err=True)
            raise typer.Exit(EXIT_FAULT) from None
        except (typer.Exit, typer.Abort, click.exceptions.Exit, click.ClickException, click.Abort):
            raise
        except Exception as err:
            if debug_enabled():
                raise
            typer.echo(internal_error_report(fn.__name__, err), err=True)
            raise typer.Exit(EXIT_INTERNAL) from None

    return wrapper  # type: ignore[return-value]


def internal_error_report(command: str, err: BaseException) -> str:
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
    rank 0 only)."""
    if _is_rank_zero():
        typer.echo(message, err=True)


def _is_rank_zero() -> bool:
    return os.environ.get("RANK", "0") == "0"


def show(data: Any, as_json: bool, text: Callable[[], str]) -> None:
    """`data` as JSON on stdout with --json, else its `text`."""
    typer.echo(json_text(data) if as_json else text())


# Options of the commands themselves (not of a library setting) that several commands share:
# declared once, so they read and behave the same everywhere.
CKPT = Knob(
    flag="--ckpt",
    metavar="DIR",
    help="Checkpoint directory (HF causal LM) or .gguf file (needs otb-diag[gguf]), repeatable "
    "where a command measures several; or a run directory holding checkpoint-* (HF Trainer/TRL) "
    "or global_step_* (verl) checkpoints. Default: the embedded final checkpoint.",
)
ROLLOUTS = Knob(
    metavar="PATH",
    help="Rollouts: a file (JSONL/Parquet, verl dump, TRL completion log), a directory (verl's "
    "rollout_data_dir, a TRL output_dir; every *.jsonl/*.parquet in step order) or a quoted "
    "glob. Default: embedded.",
)
OUT_DIR = Knob(flag="--out", metavar="DIR", help="Output directory (created).")
OUT_FILE = Knob(flag="--out", metavar="FILE", help="File to write.")
JSON = Knob(flag="--json", help="Print the summary as JSON on stdout instead of the text.")
QUIET = Knob(help="No progress bar.")


@dataclass(frozen=True)
class Measuring:
    """What a command measuring rollouts under checkpoints takes beside its settings."""

    ckpt: list[Path] | None = knob(None, CKPT)
    rollouts: Path | None = knob(None, ROLLOUTS)
    as_json: bool = knob(False, JSON)
    quiet: bool = knob(False, QUIET)
    scenario: str = scenario_knob()


def command(fn: Callable[..., None] | None = None, *, skip: tuple[str, ...] = ()) -> Any:
    """The Typer command of `fn`, whose parameters are settings dataclasses: one option per knob
    field (nested dataclasses flattened; `skip` names fields, as `load.device_map`, that this
    command does not offer), each with the field's default, so the command line and the API
    agree by construction. `fn` is called with one instance per parameter, built from the
    options; errors are reported by `friendly_errors`. Register it with `register`."""
    if fn is None:
        return functools.partial(command, skip=skip)
    return Command(fn, skip)


def register(app: typer.Typer, name: str, cmd: Command) -> None:
    app.command(name, cls=cmd.click_class())(cmd)


class Command:
    """A callable whose `__signature__` Typer reads to build the options. What only a registry
    knows (help listing its names, a default it supplies) is filled in when the help is shown,
    so parsing a command line imports no registry and a name registered later still shows."""

    def __init__(self, fn: Callable[..., None], skip: tuple[str, ...]) -> None:
        self.__name__, self.__qualname__, self.__doc__ = fn.__name__, fn.__qualname__, fn.__doc__
        self.__module__ = fn.__module__
        self.__annotations__: dict[str, Any] = {}  # the signature carries them
        hints = typing.get_type_hints(fn)
        self.parts = [(name, hints[name]) for name in inspect.signature(fn).parameters]
        self.skip = skip

        @functools.wraps(fn)
        def run(**values: Any) -> None:  # a value the parsers refuse is bad input too
            fn(**{name: _build(cls, "", values, skip) for name, cls in self.parts})

        self.run = friendly_errors(run)

    def options(self) -> list[Option]:
        """Every option, in the order of the parts and their fields."""
        found = [option for _, cls in self.parts for option in _options(cls, "")]
        return [option for option in found if option.path not in self.skip]

    @property
    def __signature__(self) -> inspect.Signature:
        params = []
        for option in self.options():
            spec = option.knob
            help_text = "" if callable(spec.help) else spec.help
            info: Any = (
                typer.Argument(metavar=spec.metavar, help=help_text)
                if spec.argument
                else typer.Option(option.flag, help=help_text, metavar=spec.metavar, min=spec.min)
            )
            annotation = Annotated[spec.cli or option.hint, info]
            params.append(
                inspect.Parameter(
                    option.name, KEYWORD, default=option.cli_default(), annotation=annotation
                )
            )
        return inspect.Signature(params)

    def click_class(self) -> type[TyperCommand]:
        lazy = {o.name: o for o in self.options() if callable(o.knob.help) or o.lazy_default}
        return type("KnobCommand", (KnobCommand,), {"lazy": lazy})

    def __call__(self, **values: Any) -> None:
        self.run(**values)


class KnobCommand(TyperCommand):
    """Fills in, when the help is shown, what a registry knows (see `Command`)."""

    lazy: dict[str, Option] = {}

    def format_help(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        for param in self.params:
            option = self.lazy.get(param.name or "")
            if option is not None:
                param.help = option.knob.help_text()
                if option.lazy_default:
                    param.default = option.shown_default()
        super().format_help(ctx, formatter)


@dataclass(frozen=True)
class Option:
    """One knob field as a command-line option."""

    path: str  # dotted, as `load.device`
    field: dataclasses.Field[Any]
    knob: Knob
    hint: Any  # the field's type

    @property
    def name(self) -> str:
        return self.path.rsplit(".", 1)[-1]

    @property
    def flag(self) -> str:
        return self.knob.flag or "--" + self.name.replace("_", "-")

    @property
    def lazy_default(self) -> bool:
        """A registry's default (a `factory`): the option's own is None, which keeps it."""
        return self.field.default_factory is not dataclasses.MISSING

    def shown_default(self) -> Any:
        """The field's default as typed on the command line."""
        default = self.field.default_factory() if self.lazy_default else self.field.default
        if default is dataclasses.MISSING:
            return inspect.Parameter.empty
        return self.knob.show(default) if self.knob.show and default is not None else default

    def cli_default(self) -> Any:
        return None if self.lazy_default else self.shown_default()


KEYWORD = inspect.Parameter.KEYWORD_ONLY


def _options(cls: Any, prefix: str) -> list[Option]:
    hints = typing.get_type_hints(cls)
    found = []
    for field in dataclasses.fields(cls):
        path = prefix + field.name
        if KEY not in field.metadata:
            if not dataclasses.is_dataclass(hints[field.name]):
                raise TypeError(f"{cls.__name__}.{field.name} is neither a knob nor internal")
            found += _options(hints[field.name], path + ".")
        elif field.metadata[KEY] is not None:
            found.append(Option(path, field, field.metadata[KEY], hints[field.name]))
    return found


def _build(cls: Any, prefix: str, values: dict[str, Any], skip: tuple[str, ...]) -> Any:
    """An instance of `cls` from the option values (named by the fields' last names)."""
    hints = typing.get_type_hints(cls)
    kwargs = {}
    for field in dataclasses.fields(cls):
        path = prefix + field.name
        spec = field.metadata.get(KEY, ...)
        if spec is ...:
            kwargs[field.name] = _build(hints[field.name], path + ".", values, skip)
        elif spec is not None and path not in skip:
            value = values[field.name]
            if value is None and field.default_factory is not dataclasses.MISSING:
                continue  # the registry's default
            kwargs[field.name] = spec.parse(value) if spec.parse and value is not None else value
    return cls(**kwargs)
