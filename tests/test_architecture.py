"""The layering of ARCHITECTURE.md, checked on the source: every `otb_diag` import (module level
or inside a function) points from a layer to one below it, never up or sideways into a higher
one. `maths` imports nothing but `errors`."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# Rank of each layer: a module may import from layers of lower rank and from its own.
RANK = {
    "__init__": 0,  # the package root: `__version__`, and the API names it resolves lazily
    "errors": 0,
    "knobs": 0.5,  # the knob fields of the settings dataclasses (may use errors)
    "maths": 1,
    "dynamics": 1,
    "runtime": 2,
    "policy": 3,
    "io": 4,
    "plots": 5,
    "lab": 6,
    "pipelines": 7,
    "integrations": 8,  # TRL and verl hooks: call library functions, write dumps
    "api": 8,
    "cli": 8,
    "__main__": 9,
}


def layer(module: str) -> str:
    """`otb_diag.maths.estimators.baselines` -> `maths`; `otb_diag.cli.main` -> `cli`;
    `otb_diag.__version__` -> `__init__`."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in RANK else "__init__"


def sources() -> list[tuple[str, Path]]:
    found = []
    for path in sorted((ROOT / "otb_diag").rglob("*.py")):
        rel = path.relative_to(ROOT).with_suffix("")
        found.append((".".join(rel.parts).removesuffix(".__init__"), path))
    for path in sorted((ROOT / "cli").glob("*.py")):
        found.append(("otb_diag.cli." + path.stem, path))
    return found


def imports(path: Path) -> list[tuple[int, str]]:
    out = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module == "otb_diag":
                out += [(node.lineno, f"otb_diag.{a.name}") for a in node.names]
            elif node.module.startswith("otb_diag."):
                out.append((node.lineno, node.module))
        elif isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names if a.name.startswith("otb_diag.")]
    return out


@pytest.mark.parametrize(("module", "path"), sources(), ids=[m for m, _ in sources()])
def test_dependencies_point_down(module: str, path: Path) -> None:
    own = layer(module)
    if own == "__init__":
        return
    bad = [
        f"{path.relative_to(ROOT)}:{line} imports {target}"
        for line, target in imports(path)
        if layer(target) != own and RANK[layer(target)] >= RANK[own]
    ]
    assert not bad, "\n".join(bad)


def test_maths_imports_nothing_but_maths_and_errors() -> None:
    """The rule a reader relies on most, stated on its own."""
    for module, path in sources():
        if layer(module) == "maths":
            assert {layer(t) for _, t in imports(path)} <= {"maths", "errors"}, module


def test_every_module_belongs_to_a_layer() -> None:
    """A new subpackage must be given its place in RANK (and in ARCHITECTURE.md)."""
    unplaced = [m for m, _ in sources() if layer(m) == "__init__" and m != "otb_diag"]
    assert not unplaced


PIPELINE_FUNCTION_LINES = 80  # a recipe step a reader holds in view at once


def test_pipelines_read_like_the_algorithm() -> None:
    """No function under pipelines/ runs over ~80 lines, and none wraps a step in a
    `Dist.checked(lambda ...)`: a phase every rank agrees on is an `@agreed` function
    (runtime/torchrun.py), so the science never sees ranks."""
    long, wrapped = [], []
    for module, path in sources():
        if not module.startswith("otb_diag.pipelines"):
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                lines = node.end_lineno - node.lineno + 1
                if lines > PIPELINE_FUNCTION_LINES:
                    long.append(f"{module}.{node.name}: {lines} lines")
            elif (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr == "checked"
                and any(isinstance(a, ast.Lambda) for a in node.args)
            ):
                wrapped.append(f"{module}:{node.lineno}")
    assert not long, long
    assert not wrapped, wrapped


# What asks which rank this is (`Dist`'s attributes) or moves objects between ranks (its
# methods, when called), and the torchrun names that hand a `Dist` out. A recipe shards its work
# through `runtime/sharded.py`.
RANK_ATTRIBUTES = {"rank", "is_main", "world_size"}
RANK_METHODS = {"on_main", "checked", "gather", "all_gather", "share"}
TORCHRUN_ALLOWED = {"agreed", "DistributedError"}  # a phase; the error a lost rank raises
RANKS_KNOWN_IN = {
    "otb_diag.pipelines.shell",  # the one shell: session, rank 0's staging folder
}


def test_no_rank_call_in_pipelines_below_the_shell() -> None:
    """Under pipelines/, only the recipe shell (`pipelines/shell.py:run_recipe`) knows there
    are ranks: no other module asks which rank it runs on, or gathers, shares or checks across
    ranks (`Dist`'s attributes), or takes a `Dist`; each shards its work through
    `runtime/sharded.py` and gets what rank 0 alone holds as a value (None elsewhere)."""
    found = []
    for module, path in sources():
        if not module.startswith("otb_diag.pipelines") or module.startswith(tuple(RANKS_KNOWN_IN)):
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Attribute) and node.attr in RANK_ATTRIBUTES:
                found.append(f"{module}:{node.lineno} .{node.attr}")
            elif (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr in RANK_METHODS
            ):
                found.append(f"{module}:{node.lineno} .{node.func.attr}()")
            elif isinstance(node, ast.ImportFrom) and node.module == "otb_diag.runtime.torchrun":
                names = {a.name for a in node.names} - TORCHRUN_ALLOWED
                found += [f"{module}:{node.lineno} imports {n}" for n in sorted(names)]
            elif isinstance(node, ast.Name) and node.id == "Dist":
                found.append(f"{module}:{node.lineno} Dist")
    assert not found, found
