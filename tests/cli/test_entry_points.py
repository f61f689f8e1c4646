"""One entry-point convention: `cli/` parses, calls one library function, prints.

The rule, checked on the source of every command registered on `cli/main.py:app` (sub-apps
included, found through the app itself, so a new command cannot slip past):

- a *library name* is a name bound by an import from `otb_diag` outside `otb_diag.cli`, at the
  top of the command's module or inside the command function (the commands import lazily);
- a *library call* is a call, anywhere in the command function's body (lambdas and nested
  functions included), whose callee is a library name or an attribute of one (`mod.f()`);
- every command function makes exactly one library call.

Not library calls, so free: `cli/common.py:show` and `note` (printing), the command's own
dataclasses, Python and Typer (`typer.Exit`), and methods of the value the one call returned
(`result.format()`). Resolving defaults, checking a scenario, formatting a result: all of that
belongs in the entry point (`otb_diag/pipelines/inputs.py:Inputs` holds the raw --ckpt,
--rollouts and --scenario that `energy`, `variance-compare`, `train` and `figures` resolve).
Every entry point has one shape (`SHAPE`)."""

from __future__ import annotations

import ast
import importlib
import inspect
from typing import Any

import pytest
from test_knobs import COMMANDS


def library_calls(tree: ast.Module, function: str) -> list[str]:
    """The library calls (as source text) in the top-level `function` of a module's `tree`
    (module docstring)."""
    fn = next(
        node
        for node in tree.body
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name == function
    )
    names = _library_names(tree.body) | _library_names(list(ast.walk(fn)))
    return [
        ast.unparse(node.func)
        for node in ast.walk(fn)
        if isinstance(node, ast.Call) and _root(node.func) in names
    ]


def _library_names(nodes: list[ast.AST]) -> set[str]:
    names: set[str] = set()
    for node in nodes:
        if isinstance(node, ast.ImportFrom) and node.level == 0 and _library(node.module or ""):
            names |= {alias.asname or alias.name for alias in node.names}
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if _library(alias.name):
                    names.add(alias.asname or alias.name.split(".")[0])
    return names


def _library(module: str) -> bool:
    return (module == "otb_diag" or module.startswith("otb_diag.")) and not (
        module == "otb_diag.cli" or module.startswith("otb_diag.cli.")
    )


def _root(func: ast.expr) -> str | None:
    """`f` of `f(...)` and of `f.g.h(...)`; None for a call on anything else."""
    while isinstance(func, ast.Attribute):
        func = func.value
    return func.id if isinstance(func, ast.Name) else None


def calls_of(name: str) -> list[str]:
    """The library calls of the command `name` (as typed: `lab build`)."""
    cmd = dict(COMMANDS)[name]
    source = inspect.getsource(importlib.import_module(cmd.__module__))
    return library_calls(ast.parse(source), cmd.__name__)


def entry_point(name: str) -> Any:
    """The library function the command `name` calls, found by the import that names it."""
    cmd = dict(COMMANDS)[name]
    (called,) = calls_of(name)
    tree = ast.parse(inspect.getsource(importlib.import_module(cmd.__module__)))
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            for alias in node.names:
                if (alias.asname or alias.name) == called:
                    return getattr(importlib.import_module(node.module), alias.name)
    raise LookupError(called)


@pytest.mark.parametrize("name", [n for n, _ in COMMANDS])
def test_a_command_calls_one_library_function(name: str) -> None:
    calls = calls_of(name)
    assert len(calls) == 1, f"`{name}` calls {calls}: move all but the entry point into it"


@pytest.mark.parametrize("name", [n for n, _ in COMMANDS])
def test_the_entry_points_defaults_are_the_command_lines(name: str) -> None:
    """A keyword the entry point shares with the command's options (`scenario`, `seed`,
    `model_free`, ...) has the option's default, and `progress` is on unless --quiet is: the
    Python API behaves as the command line does when told nothing."""
    defaults = {option.name: option.field.default for option in dict(COMMANDS)[name].options()}
    for param in inspect.signature(entry_point(name)).parameters.values():
        if param.default is inspect.Parameter.empty:
            continue
        if param.name == "progress":
            assert param.default is not defaults.get("quiet", False), name
        elif param.name in defaults:
            assert param.default == defaults[param.name], f"{name}: {param.name}"


# The one shape of an entry point: positionally the files as given (`inputs`), the folder or file
# it writes (`out`; none for a command that writes no folder, regress) and its knobs
# (`settings`; none for a command with no knob beside its inputs, report); keyword-only, its
# progress bars and its notes, where it has them.
SHAPE = ("inputs", "out", "settings")
KEYWORDS = {"progress", "say"}


@pytest.mark.parametrize("name", [n for n, _ in COMMANDS])
def test_every_entry_point_has_the_one_shape(name: str) -> None:
    params = inspect.signature(entry_point(name)).parameters.values()
    positional = [p.name for p in params if p.kind is p.POSITIONAL_OR_KEYWORD]
    keywords = {p.name for p in params if p.kind is p.KEYWORD_ONLY}
    assert positional[0] == "inputs", name
    assert positional == [part for part in SHAPE if part in positional], name
    assert keywords <= KEYWORDS, f"{name}: {keywords - KEYWORDS} belong in its settings"


def test_the_rule_sees_lazy_imports_lambdas_and_module_aliases() -> None:
    """The checker itself, on a command written the old way."""
    source = """
from otb_diag.cli.common import note, show
from otb_diag.knobs import knob
import otb_diag.lab.summary as summary

def cmd(run):
    from otb_diag.lab.build import build_lab
    manifest = build_lab(run.out)
    note("built")
    show(manifest, run.as_json, lambda: summary.format_lab(manifest, run.out))
    return manifest.get("x")
"""
    calls = library_calls(ast.parse(source), "cmd")
    assert sorted(calls) == ["build_lab", "summary.format_lab"]


@pytest.mark.parametrize("name", [n for n, _ in COMMANDS])
def test_every_entry_point_runs_its_body_in_the_shell(name: str) -> None:
    """The session, the load check, the staging folder and the record file are the shell's
    (`pipelines/shell.py:run_recipe`): no command sets them up on its own. The call may sit in a
    private helper of the entry point's module (energy's `_measure`)."""
    entry = entry_point(name)
    tree = ast.parse(inspect.getsource(importlib.import_module(entry.__module__)))
    functions = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}
    seen, todo = set(), [entry.__name__]
    while todo:
        fn = functions[todo.pop()]
        seen.add(fn.name)
        called = {_root(n.func) for n in ast.walk(fn) if isinstance(n, ast.Call)}
        if "run_recipe" in called:
            return
        todo += [c for c in called if c in functions and c not in seen]
    raise AssertionError(f"`{name}`: {sorted(seen)} never call run_recipe")
