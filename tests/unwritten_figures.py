"""Figures drawn but not rendered, for tests that run a command to read its numbers: PNG and
PDF at 200 dpi (`otb_diag/plots/style.py`) are most of a small run's time. The figures' files
are tested by the commands' own tests (tests/cli, tests/plots)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import pytest
from matplotlib.figure import Figure


@contextlib.contextmanager
def unwritten_figures() -> Iterator[None]:
    """Within: every figure's `savefig` writes an empty file where the figure would be, so a
    command's outputs are all there, drawn, and none is rendered."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(Figure, "savefig", lambda _, path, **__: Path(path).write_bytes(b""))
        yield
