"""What each command hands its figures: one record per command, whose fields are what the
entries of `registry.py` need (`FigureEntry.needs` names them; a test holds every need to a
field). A field that is None is data the run did not make (no second checkpoint, no full mode,
one log): the figures it triggers are not drawn (`FigureEntry.drawn_when`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pandas as pd

    from otb_diag.plots.dynamics import ArmMarks, RunMarks


@dataclass(frozen=True)
class EnergyFigures:
    """`otb-diag energy`: the last checkpoint's responses and tokens, the group shown."""

    sequences: pd.DataFrame  # sequences.csv's rows of the last checkpoint
    group: str  # the group fig3 and fig4 show
    group_tokens: pd.DataFrame  # that group's tokens (fig4's cumulative energy)
    shown: Sequence[int]  # the samples of that group fig4 draws (`energy.py:spread_samples`)
    sampled_tokens: pd.DataFrame  # the tokens fig5 bins (p_t, w_t)
    vocab_size: int | None  # None: model-free (fig5 draws no envelope)
    sequences_by_step: pd.DataFrame | None = None  # every checkpoint's; None: only one


@dataclass(frozen=True)
class VarianceFigures:
    """`otb-diag variance-compare`, at one call of `save_figures`: a mode's variance rows, the
    knee's rows, or the fidelity tokens and blocks; what a call does not draw is None."""

    aggregation: str | None = None  # the first aggregation: the one the figures show
    variance_rows: pd.DataFrame | None = None  # variance.csv's rows of one mode
    noise_rows: pd.DataFrame | None = None  # noise_scale.csv's rows of the most exact mode
    noise_aggregation: str | None = None
    fidelity_tokens: pd.DataFrame | None = None  # per token: w_t and the true ‖s_t‖²
    block_rows: pd.DataFrame | None = None  # variance_blocks.csv's rows (--by-block)


@dataclass(frozen=True)
class DynamicsFigures:
    """`otb-diag dynamics`: the logs as one table and the rows of collapse.json."""

    table: pd.DataFrame  # dynamics.csv
    runs: Sequence[RunMarks]  # collapse.json's runs
    target: float | None  # --target (None: none given; the figures draw no target line)
    live_runs: Sequence[RunMarks] | None = None  # None: no log carries the live diagnostics
    budget: pd.DataFrame | None = None  # budget.csv; None: no log holds the split
    arms: Sequence[ArmMarks] | None = None  # the comparison at equal tokens; None: one run
    arm_of: dict[str, str] | None = None  # run -> its arm (with `arms`)


FigureData = EnergyFigures | VarianceFigures | DynamicsFigures
# The record each command's figures read.
FIGURE_DATA: dict[str, type[FigureData]] = {
    "energy": EnergyFigures,
    "variance-compare": VarianceFigures,
    "dynamics": DynamicsFigures,
}
