"""Figures drawn but not rendered, for tests that run a command to read its numbers: PNG and
PDF at 200 dpi (`otb_diag/plots/style.py`) are most of a small run's time. The figures' files
are tested by the commands' own tests (tests/cli, tests/plots)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import matplotlib as mpl
import pytest
from matplotlib.figure import Figure


def _drawn(fig: Figure, path: str | Path, **_: object) -> None:
    """`savefig` without the image: the figure is laid out (`draw_without_rendering`: ticks,
    scales, text, and the tight bounding box where `savefig.bbox` asks for it; a figure
    matplotlib cannot draw still raises, as a log axis of zeros did) and an empty file takes the
    image's place. A figure is laid out again only if it changed since (`stale`, which any
    artist's change sets): its PDF, saved right after its PNG, is not drawn twice."""
    if fig.stale:
        fig.draw_without_rendering()
        if mpl.rcParams["savefig.bbox"] == "tight":  # as savefig would: every artist's extent
            fig.get_tightbbox()
        fig.stale = False  # the extents' computation marks it stale; nothing in it changed
    Path(path).write_bytes(b"")


@contextlib.contextmanager
def unwritten_figures(rendered: tuple[str, ...] = ()) -> Iterator[None]:
    """Within: every figure's `savefig` draws it and writes an empty file where the figure would
    be, so a command's outputs are all there, drawn, and none is rendered; but the formats in
    `rendered`, saved as ever (`("png",)`: the images `otb-diag report` embeds)."""
    savefig = Figure.savefig

    def saved(fig: Figure, path: str | Path, **kwargs: object) -> None:
        fmt = kwargs.get("format") or Path(path).suffix.lstrip(".")
        if fmt in rendered:
            savefig(fig, path, **kwargs)
            fig.stale = False  # drawn in full: its next format need not lay it out again
        else:
            _drawn(fig, path)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(Figure, "savefig", saved if rendered else _drawn)
        yield
