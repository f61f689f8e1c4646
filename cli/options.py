"""Command-line options built from settings dataclasses: each knob field (`otb_diag/knobs.py`)
becomes a Typer option with the field's default, flag and help, and the command function is
called with the dataclass instances the options make. Beside them, the options of the commands
themselves that several share (--ckpt, --rollouts, --out, --json, --quiet), declared once."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import inspect
import typing
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Annotated, Any

import click
import typer
from otb_diag.cli.common import friendly_errors, note
from typer.core import TyperCommand

from otb_diag.knobs import KEY, Checked, Knob, knob
from otb_diag.pipelines.inputs import CKPT as CKPT  # re-exported: train, rollouts
from otb_diag.pipelines.inputs import ROLLOUTS as ROLLOUTS
from otb_diag.pipelines.inputs import Inputs
from otb_diag.runtime.threads import AUTO, THREADS, command_threads

# Options of the commands themselves (not of a library setting) that several commands share:
# declared once, so they read and behave the same everywhere (--ckpt and --rollouts beside
# `Inputs`, which takes them).
OUT_DIR = Knob(flag="--out", metavar="DIR", help="Output directory (created).")
OUT_FILE = Knob(flag="--out", metavar="FILE", help="File to write.")
JSON = Knob(flag="--json", help="Print the summary as JSON on stdout instead of the text.")
QUIET = Knob(help="No progress bar.")


@dataclass(frozen=True)
class Measuring(Checked):
    """What a command reading checkpoints and rollouts (or its scenario's) takes beside its
    settings."""

    inputs: Inputs = Inputs()  # --ckpt, --rollouts, --scenario: the entry point resolves them
    as_json: bool = knob(False, JSON)
    quiet: bool = knob(False, QUIET)
    threads: int | None = knob(None, THREADS)  # None: auto


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
    """Add `cmd` to `app` as `name`; `{figures}` in its help becomes the figures the registry
    lists for `name` (`plots/registry.py:figure_names`)."""
    if cmd.__doc__ and "{figures}" in cmd.__doc__:
        from otb_diag.plots.registry import figure_names

        cmd.__doc__ = cmd.__doc__.replace("{figures}", figure_names(name))
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
            parts = {name: instance(cls, "", values, skip) for name, cls in self.parts}
            with _threads(next(iter(parts.values()), None)):
                fn(**parts)

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
                else typer.Option(option.flag, help=help_text, metavar=spec.metavar)
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


@contextlib.contextmanager
def _threads(run: Any) -> Iterator[None]:
    """A command that runs a model (its first part has the `THREADS` knob, `threads`, and
    `inputs` that size its model) runs on the torch threads chosen once, before its entry
    point (`otb_diag/runtime/threads.py:command_threads`), said on stderr where auto chose."""
    if not hasattr(run, "threads"):
        yield
        return
    with command_threads(run.threads, run.inputs.parameters) as chosen:
        if chosen.source == AUTO:
            note(chosen.sentence())
        yield


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
        return self.knob.flag_of(self.name)

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


def instance(cls: Any, prefix: str, values: dict[str, Any], skip: tuple[str, ...]) -> Any:
    """An instance of `cls` from the option values (named by the fields' last names)."""
    hints = typing.get_type_hints(cls)
    kwargs = {}
    for field in dataclasses.fields(cls):
        path = prefix + field.name
        spec = field.metadata.get(KEY, ...)
        if spec is ...:
            kwargs[field.name] = instance(hints[field.name], path + ".", values, skip)
        elif spec is not None and path not in skip:
            value = values[field.name]
            if value is None and field.default_factory is not dataclasses.MISSING:
                continue  # the registry's default
            kwargs[field.name] = spec.parse(value) if spec.parse and value is not None else value
    return cls(**kwargs)
