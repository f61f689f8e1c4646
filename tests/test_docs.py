"""The documentation points at things that exist: every `path.py:name` named in README.md,
ARCHITECTURE.md and docs/*.md is a file with that top-level function, class or constant (or
`Class.method`); every "docs/theory.md §N" in the code has a section "## N." in docs/theory.md;
every relative link resolves; README.md stays short."""

from __future__ import annotations

import ast
import re
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", ROOT / "ARCHITECTURE.md", *sorted((ROOT / "docs").glob("*.md"))]
README_MAX_LINES = 250

# `path.py:name` or `path.py:Class.method`, the path relative to the repository root.
REFERENCE = re.compile(r"\b((?:[\w.-]+/)*[\w-]+\.py):([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)?)")
# "theory.md §3", "theory.md section 3", "theory §3", "theory.md §1–2",
# "theory.md, sections 1 and 2"
THEORY = re.compile(r"theory(?:\.md)?,?\s*(?:§\s*|sections?\s+)(\d+)(?:\s*(?:–|-|and)\s*(\d+))?")
LINK = re.compile(r"\]\(([^)\s]+)\)")


def references() -> list[tuple[str, str, str]]:
    found = []
    for doc in DOCS:
        for path, name in REFERENCE.findall(doc.read_text(encoding="utf-8")):
            found.append((doc.name, path, name))
    return sorted(set(found))


@cache
def top_level_names(path: Path) -> dict[str, set[str]]:
    """Top-level names of a module -> the method names when the name is a class."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    names: dict[str, set[str]] = {}
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            names[node.name] = set()
        elif isinstance(node, ast.ClassDef):
            names[node.name] = {
                n.name for n in node.body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)
            }
        elif isinstance(node, ast.Assign):
            for target in node.targets:
                if isinstance(target, ast.Name):
                    names[target.id] = set()
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names[node.target.id] = set()
    return names


def test_docs_name_references() -> None:
    assert references(), "no `path.py:name` reference found: the pattern is wrong"


@pytest.mark.parametrize(("doc", "path", "name"), references())
def test_reference_exists(doc: str, path: str, name: str) -> None:
    file = ROOT / path
    assert file.is_file(), f"{doc} names {path}:{name}, but {path} does not exist"
    defined = top_level_names(file)
    top, _, method = name.partition(".")
    assert top in defined, f"{doc} names {path}:{name}, but {path} defines no top-level {top}"
    if method:
        assert method in defined[top], f"{doc} names {path}:{name}: {top} has no method {method}"


def theory_sections() -> set[int]:
    text = (ROOT / "docs" / "theory.md").read_text(encoding="utf-8")
    return {int(n) for n in re.findall(r"^## (\d+)\.", text, re.M)}


def code_theory_references() -> list[tuple[str, int]]:
    found = []
    for folder in ("otb_diag", "cli"):
        for file in sorted((ROOT / folder).rglob("*.py")):
            for match in THEORY.finditer(file.read_text(encoding="utf-8")):
                first = int(match[1])
                last = int(match[2]) if match[2] else first
                for n in range(first, last + 1):
                    found.append((str(file.relative_to(ROOT)), n))
    return found


def test_code_theory_references_have_a_section() -> None:
    found = code_theory_references()
    assert found, "no theory.md reference found in the code: the pattern is wrong"
    sections = theory_sections()
    missing = sorted({(f, n) for f, n in found if n not in sections})
    assert not missing, f"no '## N.' heading in docs/theory.md for: {missing}"


def test_theory_keeps_sections_1_to_6() -> None:
    assert {1, 2, 3, 4, 5, 6} <= theory_sections()


def test_readme_is_short() -> None:
    lines = (ROOT / "README.md").read_text(encoding="utf-8").count("\n")
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines (at most {README_MAX_LINES})"


@pytest.mark.parametrize("doc", DOCS, ids=lambda d: str(d.relative_to(ROOT)))
def test_relative_links_resolve(doc: Path) -> None:
    broken = []
    for target in LINK.findall(doc.read_text(encoding="utf-8")):
        if re.match(r"[a-z]+:", target) or target.startswith("#"):
            continue  # a URL or an anchor in the same page
        path = target.split("#", 1)[0]
        if not (doc.parent / path).exists():
            broken.append(target)
    assert not broken, f"{doc.name} links to missing files: {broken}"
