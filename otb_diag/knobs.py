"""One declaration per knob: a settings dataclass field carries its default and, in its metadata,
everything the command line needs (flag, help, how the typed text becomes the field's value).
`cli/` builds each command's options from these fields, so the Python API and the command line
share one default by construction (the pattern of cleanrl's `Args` dataclass read by `tyro`).

    draws: int = knob(200, at_least(2), help="Groups drawn per prompt and N.")
    modes: tuple[str, ...] = knob(("proxy", "head"), flag="--mode", parse=comma_list, show=",".join)

A knob's `check` says what is wrong with a value; a settings dataclass mixes in `Checked`, so
every check runs when an object is built (by the command line from its options, by the API,
by `dataclasses.replace`), before any file is read or any model run, and the CLI and the API
refuse a bad value with the same `InputError`. A field declared with `internal(...)` is set by
the code, never on the command line."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable
from dataclasses import MISSING, dataclass
from typing import Any

from otb_diag.errors import InputError

KEY = "knob"  # the metadata key of a field's `Knob` (None: an internal field, no option)

# What is wrong with a knob's value, in words that follow its flag ("--draws: must be at least
# 2, got 0"), or None when nothing is. None (a knob's "auto" or "not given") is never checked.
Check = Callable[[Any], str | None]


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
    check: Check | None = None
    argument: bool = False  # positional, not an option

    def help_text(self) -> str:
        return self.help() if callable(self.help) else self.help

    def flag_of(self, name: str) -> str:
        """The option's flag for the field `name`: `flag`, else `--` + the name with dashes."""
        return self.flag or "--" + name.replace("_", "-")


def knob(
    default: Any = MISSING,
    spec: Knob | Check | None = None,
    *,
    factory: Callable[[], Any] | None = None,
    **spec_fields: Any,
) -> Any:
    """A dataclass field with `default` (or `factory`) whose command-line option is `spec` (a
    knob shared by several settings, declared once) updated with `spec_fields`; a `Check` in
    `spec`'s place is the field's check (`knob(200, at_least(2), help=...)`)."""
    if spec is not None and not isinstance(spec, Knob):
        spec, spec_fields = None, {"check": spec, **spec_fields}
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


@dataclass(frozen=True)
class StepRange:
    """Inclusive range of training steps `first..last` (`--steps A-B`, or `A` alone)."""

    first: int
    last: int

    def __contains__(self, step: object) -> bool:
        return isinstance(step, int) and self.first <= step <= self.last

    def __str__(self) -> str:
        return f"{self.first}-{self.last}"


def parse_steps(text: str | None) -> StepRange | None:
    """`"A-B"` or `"A"` as a `StepRange`; None for None. Bad text is an `InputError`."""
    if text is None:
        return None
    match = re.fullmatch(r"\s*(\d+)\s*(?:-\s*(\d+)\s*)?", text)
    if match is None:
        raise InputError(
            f"expected a step range such as 100-200 (or one step, 150), got {text!r}",
            field="--steps",
        )
    first = int(match[1])
    last = int(match[2]) if match[2] is not None else first
    if last < first:
        raise InputError(f"the range {text!r} ends before it starts", field="--steps")
    return StepRange(first, last)


def joined(values: Any) -> str:
    """The inverse of `comma_list` and `comma_ints`."""
    return ",".join(str(v) for v in values)


def optional_tuple(values: Any) -> tuple[Any, ...] | None:
    """A repeatable option's values as a tuple, None when none was given."""
    return tuple(values) if values else None


class Checked:
    """Mixed into a dataclass of knobs: building an object checks every knob's value
    (`check_knobs`), then `together`, what several of its knobs must satisfy at once; both
    raise `InputError`, so a bad value stops the command line (exit 2) and the API alike
    before any work. A nested dataclass of knobs checks itself, being `Checked` too."""

    def __post_init__(self) -> None:
        check_knobs(self)
        self.together()

    def together(self) -> None:
        """What several knobs must satisfy at once (nothing, unless a class says so)."""


def check_knobs(settings: Any) -> None:
    """An `InputError` naming the flag of the first knob of `settings` whose `check` refuses
    its value, e.g. "--draws: must be at least 2, got 0"."""
    for field in dataclasses.fields(settings):
        spec, value = field.metadata.get(KEY), getattr(settings, field.name)
        if spec is None or spec.check is None or value is None:
            continue
        problem = spec.check(value)
        if problem:
            raise InputError(f"{spec.flag_of(field.name)}: {problem}")


# The checks a knob declares (`Knob.check`): each returns what is wrong with a value, or None.


def at_least(bound: float, why: str = "") -> Check:
    """A number no smaller than `bound` (`why`, when given, follows the refusal)."""
    return lambda value: None if value >= bound else f"must be at least {bound}, got {value}{why}"


def above(bound: float, why: str = "") -> Check:
    """A number strictly larger than `bound` (and not NaN)."""
    return lambda value: None if value > bound else f"must be above {bound}, got {value}{why}"


def valid_seed(value: int) -> str | None:
    """A seed every generator takes: numpy's refuse a negative one, torch's one of 2^63 or more."""
    return None if 0 <= value < 2**63 else f"must be a whole number from 0 to 2^63 - 1, got {value}"


def named(value: str) -> str | None:
    """A column's, a group's or a label's name: some text, not blank."""
    return None if value.strip() else "must name something, got an empty name"


def one_of(choices: tuple[str, ...]) -> Check:
    """A name among `choices`."""
    return lambda value: (
        None if value in choices else f"must be one of {', '.join(choices)}, got '{value}'"
    )


def each(check: Check | None = None) -> Check:
    """A list of one or more values, none twice, each passing `check`."""

    def check_all(values: tuple[Any, ...]) -> str | None:
        if not values:
            return "names nothing; give at least one value"
        twice = sorted({str(v) for v in values if list(values).count(v) > 1})
        if twice:
            return f"names {', '.join(twice)} more than once"
        for value in values:
            problem = check(value) if check else None
            if problem:
                return f"{problem} (in {joined(values)})" if len(values) > 1 else problem
        return None

    return check_all


def refused_by(parse: Callable[[Any], Any]) -> Check:
    """What `parse`, which raises `InputError` on a value it cannot read, says of the value."""

    def check(value: Any) -> str | None:
        try:
            parse(value)
        except InputError as err:
            return err.message
        return None

    return check
