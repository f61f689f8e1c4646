"""The verifier registry: the one place that knows every reward function `rollouts sample` can
score responses with.

A verifier is one function registered with `@register_verifier`:

    fn(prompt: str, response: str, answer: str | None, arg: str | None) -> float

named on the command line as `NAME` or `NAME:ARG` (`last-number:0.01`, `regex:PATTERN`); the
entry says whether it needs an answer and whether it takes the argument. Any other spec is a
user function, `path/to/file.py:fn` or `module:fn`, called as `fn(prompt, response, answer)`.
`get_verifier(spec)` resolves a spec to a `Verifier`, a callable `(prompt, response, answer) ->
float`; an unknown name lists the registered ones. vLLM users score their pools with the same
call (docs/sampling.md).
"""

from __future__ import annotations

import importlib
import importlib.util
import math
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from otb_diag.errors import InputError

VerifierFn = Callable[[str, str, "str | None", "str | None"], float]


@dataclass(frozen=True)
class Entry:
    """One registry entry: the function and what it needs."""

    name: str
    fn: VerifierFn
    needs_answer: bool = True
    arg: str | None = None  # what ARG means in NAME:ARG, None when it takes none
    arg_required: bool = False
    help: str = ""
    extra: str | None = None  # the otb-diag extra it needs installed (`pip install otb-diag[X]`)


VERIFIERS: dict[str, Entry] = {}


def register_verifier(
    name: str,
    *,
    needs_answer: bool = True,
    arg: str | None = None,
    arg_required: bool = False,
    help: str = "",
    extra: str | None = None,
) -> Callable[[VerifierFn], VerifierFn]:
    """Decorator adding `fn` to the registry under `name` (once)."""

    def decorator(fn: VerifierFn) -> VerifierFn:
        if name in VERIFIERS:
            raise ValueError(f"verifier '{name}' is already registered to {VERIFIERS[name].fn}")
        VERIFIERS[name] = Entry(name, fn, needs_answer, arg, arg_required, help, extra)
        return fn

    return decorator


def _verifier_names() -> tuple[str, ...]:
    return tuple(VERIFIERS)


def verifier_usage() -> str:
    """How `--verifier` is spelled, from the registry: `exact, last-number[:TOL], regex:PATTERN,
    ... or a function file.py:fn / module:fn`."""
    specs = [
        e.name
        + (f":{e.arg.upper()}" if e.arg_required else f"[:{e.arg.upper()}]" if e.arg else "")
        + (f" (needs otb-diag[{e.extra}])" if e.extra else "")
        for e in VERIFIERS.values()
    ]
    return (
        f"{', '.join(specs)}, or a function file.py:fn / module:fn called as "
        "fn(prompt, response, answer) -> float"
    )


@dataclass(frozen=True)
class Verifier:
    """A resolved spec: `verifier(prompt, response, answer) -> float`."""

    spec: str
    needs_answer: bool
    call: Callable[[str, str, str | None], Any]

    def __call__(self, prompt: str, response: str, answer: str | None) -> float:
        return self.call(prompt, response, answer)


def get_verifier(spec: str) -> Verifier:
    """The verifier named by `spec` (see the module docstring); `InputError` when unknown, when
    its argument is missing or malformed, or when a user function cannot be imported."""
    name, colon, arg = spec.partition(":")
    if name in VERIFIERS:
        entry = VERIFIERS[name]
        if colon and entry.arg is None:
            raise InputError(f"verifier '{name}' takes no argument, got '{spec}'", field="verifier")
        if entry.arg_required and not arg:
            raise InputError(
                f"verifier '{name}' needs an argument: {name}:{entry.arg.upper()}",  # type: ignore[union-attr]
                field="verifier",
            )
        if name == "regex":
            _compile(arg)  # a bad pattern is bad input now, not in the middle of the run
        if name == "last-number" and arg:
            _tolerance(arg)
        fn = entry.fn
        value = arg or None
        return Verifier(spec, entry.needs_answer, lambda p, r, a: fn(p, r, a, value))
    if colon and arg.isidentifier() and (name.endswith(".py") or _looks_like_module(name)):
        return Verifier(spec, False, _user_function(name, arg))
    raise InputError(
        f"unknown verifier '{spec}'; known verifiers: {', '.join(_verifier_names())}, or a user "
        "function as path/to/file.py:fn or module:fn, called as fn(prompt, response, answer)",
        field="verifier",
    )


def _looks_like_module(name: str) -> bool:
    return all(part.isidentifier() for part in name.split("."))


def _user_function(where: str, fn_name: str) -> Callable[..., Any]:
    if where.endswith(".py"):
        path = Path(where)
        if not path.is_file():
            raise InputError("verifier file does not exist", path=path, field="verifier")
        module_name = f"otb_diag_user_verifier_{abs(hash(str(path.resolve())))}"
        spec = importlib.util.spec_from_file_location(module_name, path)
        if spec is None or spec.loader is None:
            raise InputError("cannot load a Python module from it", path=path, field="verifier")
        module = importlib.util.module_from_spec(spec)
        sys.modules[module_name] = module
        try:
            spec.loader.exec_module(module)
        except Exception as err:
            raise InputError(
                f"importing the verifier failed: {type(err).__name__}: {err}",
                path=path,
                field="verifier",
            ) from None
    else:
        try:
            module = importlib.import_module(where)
        except ImportError as err:
            raise InputError(
                f"verifier module '{where}' cannot be imported ({err})", field="verifier"
            ) from None
    fn = getattr(module, fn_name, None)
    if not callable(fn):
        raise InputError(f"'{where}' has no function '{fn_name}'", field="verifier")
    return fn


# ---- the built-in verifiers -------------------------------------------------------------------

_NUMBER = re.compile(r"-?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?|-?\.\d+")


def _parse_number(text: str) -> float | None:
    """The number written in `text` (thousands commas allowed), else None."""
    text = text.strip().rstrip(".").replace("$", "")
    if not _NUMBER.fullmatch(text):
        return None
    return float(text.replace(",", ""))


def _last_number(text: str) -> float | None:
    """The last number written in `text` (`-3`, `1,234.5`, `.5`), else None."""
    found = _NUMBER.findall(text)
    return float(found[-1].replace(",", "")) if found else None


def last_boxed(text: str) -> str | None:
    """The content of the last `\\boxed{...}` in `text`, braces balanced, else None."""
    start = text.rfind("\\boxed{")
    if start < 0:
        return None
    depth, i = 1, start + len("\\boxed{")
    for j in range(i, len(text)):
        depth += {"{": 1, "}": -1}.get(text[j], 0)
        if depth == 0:
            return text[i:j]
    return None


def _tolerance(arg: str) -> float:
    try:
        tol = float(arg)
    except ValueError:
        tol = -1.0
    if not (tol >= 0 and math.isfinite(tol)):
        raise InputError(
            f"last-number's tolerance must be a number ≥ 0, got '{arg}'", field="verifier"
        )
    return tol


def _compile(pattern: str) -> re.Pattern[str]:
    try:
        return re.compile(pattern)
    except re.error as err:
        raise InputError(f"regex '{pattern}' does not compile: {err}", field="verifier") from None


def _same(found: float, answer: float, tol: float) -> bool:
    return abs(found - answer) <= tol * max(1.0, abs(answer))  # relative above 1, absolute below


@register_verifier("exact", help="1 when the response, stripped, equals the answer")
def exact(prompt: str, response: str, answer: str | None, arg: str | None) -> float:
    return float(response.strip() == (answer or "").strip())


@register_verifier("contains", help="1 when the answer occurs in the response")
def contains(prompt: str, response: str, answer: str | None, arg: str | None) -> float:
    return float((answer or "").strip() in response)


@register_verifier(
    "last-number",
    arg="tol",
    help="1 when the response's last number equals the answer within TOL·max(1, |answer|) "
    "(default 1e-6)",
)
def last_number_verifier(prompt: str, response: str, answer: str | None, arg: str | None) -> float:
    tol = _tolerance(arg) if arg else 1e-6
    expected = _parse_number(answer or "")
    if expected is None:
        raise ValueError(f"the answer {answer!r} is not a number")
    found = _last_number(response)
    return float(found is not None and _same(found, expected, tol))


@register_verifier(
    "boxed",
    help="1 when the last \\boxed{...} equals the answer (as text, or as numbers within 1e-6)",
)
def boxed(prompt: str, response: str, answer: str | None, arg: str | None) -> float:
    found = last_boxed(response)
    if found is None:
        return 0.0
    expected = (answer or "").strip()
    inner = last_boxed(expected)  # answers written as \boxed{...} too
    expected = inner if inner is not None else expected
    if found.strip() == expected:
        return 1.0
    a, b = _parse_number(found), _parse_number(expected)
    return float(a is not None and b is not None and _same(a, b, 1e-6))


@register_verifier(
    "regex",
    needs_answer=False,
    arg="pattern",
    arg_required=True,
    help="1 when PATTERN matches the response (re.search); with a group and an answer, the "
    "first group must equal the answer",
)
def regex(prompt: str, response: str, answer: str | None, arg: str | None) -> float:
    pattern = _compile(arg or "")
    match = pattern.search(response)
    if match is None:
        return 0.0
    if pattern.groups and answer is not None:
        return float((match.group(1) or "").strip() == answer.strip())
    return 1.0


@register_verifier(
    "math",
    extra="math",
    help="Hugging Face math-verify: 1 when the response's final answer is mathematically "
    "equal to the answer (needs `pip install 'otb-diag[math]'`)",
)
def math_verify(prompt: str, response: str, answer: str | None, arg: str | None) -> float:
    try:
        from math_verify import parse, verify
    except ImportError:
        raise InputError(
            "the verifier 'math' needs the math-verify package, which is not installed.",
            field="verifier",
            hint="Install it with `pip install 'otb-diag[math]'` (or `pip install math-verify`), "
            "or pick another verifier (boxed, last-number).",
        ) from None
    gold = parse(answer or "")
    return float(verify(gold, parse(response)))


def require_math_verify(spec: str) -> None:
    """Raise the missing-package `InputError` now when `spec` names `math` and math-verify is
    not installed (before any sampling)."""
    if spec.partition(":")[0] == "math" and importlib.util.find_spec("math_verify") is None:
        math_verify("", "", "", None)
