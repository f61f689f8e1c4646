"""The figure registry: each figure is one entry, the only module that spells its file name;
its `needs` are its plot's arguments and fields of its command's figure data; `save_figures`
draws exactly what the data holds and refuses data that lacks a need."""

import ast
import dataclasses
import inspect
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from matplotlib.figure import Figure

from otb_diag.plots import registry, style
from otb_diag.plots.figure_data import FIGURE_DATA, VarianceFigures
from otb_diag.plots.registry import FIGURES, FigureEntry, save_figures
from otb_diag.plots.style import new_figure

ROOT = Path(__file__).resolve().parents[2]


def _strings(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, text) of every string literal, f-strings' literal parts included."""
    return [
        (node.lineno, node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str)
    ]


def _spellings(entry: FigureEntry) -> re.Pattern[str]:
    """A file name of the figure in a string: `stem` alone, or `stem_` where an f-string adds
    the mode, or `stem_<mode>`."""
    if entry.modes:
        return re.compile(rf"\b{entry.stem}_(?:{'|'.join(entry.modes)}\b|$)")
    return re.compile(rf"\b{entry.stem}\b")


def test_stems_are_unique() -> None:
    stems = [s for entry in FIGURES for s in entry.file_stems()]
    assert len(stems) == len(set(stems))


def test_no_other_module_spells_a_figure_name() -> None:
    own = Path(registry.__file__).resolve()
    bad = []
    for path in sorted((ROOT / "otb_diag").rglob("*.py")):
        if path.resolve() == own:
            continue
        for line, text in _strings(ast.parse(path.read_text(encoding="utf-8"))):
            bad += [
                f"{path.relative_to(ROOT)}:{line} spells {entry.stem}"
                for entry in FIGURES
                if _spellings(entry).search(text)
            ]
    assert not bad, "\n".join(bad)


def test_the_name_scan_sees_the_spellings() -> None:
    per_mode = next(e for e in FIGURES if e.modes)
    single = next(e for e in FIGURES if not e.modes)
    code = f'a = "{single.stem}.png"\nb = f"{per_mode.stem}_{{mode}}"\nc = "otb_{per_mode.stem}"\n'
    found = [
        (line, e.stem) for line, t in _strings(ast.parse(code)) for e in FIGURES
        if _spellings(e).search(t)
    ]  # fmt: skip
    assert found == [(1, single.stem), (2, per_mode.stem)]


@pytest.mark.parametrize("entry", FIGURES, ids=[e.stem for e in FIGURES])
def test_needs_are_the_plot_arguments(entry: FigureEntry) -> None:
    params = inspect.signature(entry.plot_function).parameters
    given = set(entry.needs)
    assert given <= set(params)
    required = {n for n, p in params.items() if p.default is inspect.Parameter.empty}
    assert required <= given
    assert entry.caption.strip() and entry.command


def fake_plot(table: list[str], label: str = "") -> Figure:
    """A plot for the registry test (found as `otb_diag.plots.<module>.fake_plot`)."""
    fig, ax = new_figure()
    ax.set_title(f"{len(table)} {label}")
    return fig


@dataclass(frozen=True)
class FakeFigures:
    """A command's figure data for the registry test: `rows` always, `name` when made."""

    rows: list[int]
    name: str | None = None


@pytest.mark.slow  # renders whole figures to PNG and PDF (seconds)
def test_save_figures_draws_what_the_data_allows(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(style, "fake_plot", fake_plot, raising=False)
    monkeypatch.setitem(registry.FIGURE_DATA, "cmd", FakeFigures)
    plot = "style.fake_plot"
    entries = (
        FigureEntry("a_fig", "cmd", plot, {"table": "rows"}, "A."),
        FigureEntry(
            "b_fig", "cmd", plot, {"table": "rows", "label": "name"}, "B.", drawn_when="name"
        ),  # fmt: skip
        FigureEntry("m_fig", "cmd", plot, {"table": "rows"}, "M.", modes=("x", "y")),
        FigureEntry("other", "elsewhere", plot, {"table": "rows"}, "O."),
    )
    monkeypatch.setattr(registry, "FIGURES", entries)
    assert save_figures("cmd", FakeFigures([1]), tmp_path) == ["a_fig.png", "a_fig.pdf"]
    both = save_figures("cmd", FakeFigures([1], "n"), tmp_path / "both")
    assert both == ["a_fig.png", "a_fig.pdf", "b_fig.png", "b_fig.pdf"]
    assert save_figures("cmd", FakeFigures([1]), tmp_path, mode="y") == [
        "m_fig_y.png",
        "m_fig_y.pdf",
    ]
    assert save_figures("cmd", FakeFigures([1]), tmp_path, mode="z") == []
    assert sorted(p.name for p in tmp_path.glob("*.png")) == ["a_fig.png", "m_fig_y.png"]
    assert entries[2].file_stems() == ["m_fig_x", "m_fig_y"]
    assert entries[2].mode_of("m_fig_y") == "y" and entries[0].mode_of("a_fig") is None
    assert (
        registry.figure_names("cmd")
        == "a_fig, m_fig_<mode> (+ b_fig when the run makes their data)"
    )


def test_a_missing_need_is_an_error_not_a_skipped_figure(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A figure whose data is there but not all it needs raises, naming the need; data of
    another command's record is refused."""
    monkeypatch.setattr(style, "fake_plot", fake_plot, raising=False)
    monkeypatch.setitem(registry.FIGURE_DATA, "cmd", FakeFigures)
    entry = FigureEntry("c_fig", "cmd", "style.fake_plot", {"table": "rows", "label": "name"}, "C.")
    monkeypatch.setattr(registry, "FIGURES", (entry,))
    with pytest.raises(ValueError, match="figure c_fig needs name"):
        save_figures("cmd", FakeFigures([1]), tmp_path)
    with pytest.raises(TypeError, match="FakeFigures"):
        save_figures("cmd", VarianceFigures(), tmp_path)
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("entry", FIGURES, ids=[e.stem for e in FIGURES])
def test_needs_are_fields_of_the_commands_figure_data(entry: FigureEntry) -> None:
    """A need names a field of its command's record, so a misspelled need fails here and a
    misspelled field where the data is built fails at construction: no figure is skipped by a
    typo."""
    fields = {f.name for f in dataclasses.fields(FIGURE_DATA[entry.command])}
    assert set(entry.needs.values()) <= fields and entry.trigger in fields


def test_the_report_side_loads_no_plotting() -> None:
    """Captions and file names come without matplotlib or torch: `report` stays light."""
    code = (
        "import sys, otb_diag.pipelines.report.recipe; "
        "print('torch' in sys.modules, 'matplotlib' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"]
