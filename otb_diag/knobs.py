"""One declaration per knob: a settings dataclass field carries its default and, in its metadata,
everything the command line needs (flag, help, how the typed text becomes the field's value).
`cli/` builds each command's options from these fields, so the Python API and the command line
share one default by construction (the pattern of cleanrl's `Args` dataclass read by `tyro`).

    draws: int = knob(200, help="Groups drawn per prompt and N.")
    modes: tuple[str, ...] = knob(("proxy", "head"), flag="--mode", parse=comma_list, show=",".join)

A field declared with `internal(...)` is set by the code, never on the command line."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import MISSING, dataclass
from typing import Any

from otb_diag.errors import InputError

KEY = "knob"  # the metadata key of a field's `Knob` (None: an internal field, no option)


@dataclass(frozen=True)
class Knob:
    """How a field appears on the command line.

    `flag`: the option's name (`--draws`, `--x/--no-x`); empty: `--` + the field's name with
    dashes. `cli`: the type typed on the command line when it is not the field's (e.g. `str` for
    a comma-separated tuple). `parse`: command-line value -> field value; `show`: field value ->
    the command-line value shown and used as the option's default, so that
    `parse(show(default)) == default` (a test checks it). `help` may be a function, called each
    time the options are built (help that lists a registry's names)."""

    help: str | Callable[[], str] = ""
    flag: str = ""
    cli: Any = None
    parse: Callable[[Any], Any] | None = None
    show: Callable[[Any], Any] | None = None
    metavar: str | None = None
    min: float | None = None
    argument: bool = False  # positional, not an option

    def help_text(self) -> str:
        return self.help() if callable(self.help) else self.help


def knob(
    default: Any = MISSING,
    spec: Knob | None = None,
    *,
    factory: Callable[[], Any] | None = None,
    **spec_fields: Any,
) -> Any:
    """A dataclass field with `default` (or `factory`) whose command-line option is `spec` (a
    knob shared by several settings, declared once) updated with `spec_fields`."""
    declared = dataclasses.replace(spec, **spec_fields) if spec else Knob(**spec_fields)
    if factory is not None:
        return dataclasses.field(default_factory=factory, metadata={KEY: declared})
    return dataclasses.field(default=default, metadata={KEY: declared})


def internal(default: Any = MISSING, *, factory: Callable[[], Any] | None = None) -> Any:
    """A field the code sets (or the Python API), with no command-line option."""
    if factory is not None:
        return dataclasses.field(default_factory=factory, metadata={KEY: None})
    return dataclasses.field(default=default, metadata={KEY: None})


def comma_list(text: str) -> tuple[str, ...]:
    """`"a, b,,c"` -> `("a", "b", "c")`."""
    return tuple(part.strip() for part in text.split(",") if part.strip())


def comma_ints(text: str, what: str = "values", field: str | None = None) -> tuple[int, ...]:
    """`"2,4,8"` -> `(2, 4, 8)`; anything else is an `InputError` naming `what`."""
    try:
        return tuple(int(part) for part in comma_list(text))
    except ValueError:
        raise InputError(f"{what} must be integers, got '{text}'", field=field) from None


def joined(values: Any) -> str:
    """The inverse of `comma_list` and `comma_ints`."""
    return ",".join(str(v) for v in values)


def optional_tuple(values: Any) -> tuple[Any, ...] | None:
    """A repeatable option's values as a tuple, None when none was given."""
    return tuple(values) if values else None
