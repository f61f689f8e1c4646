"""The one style every figure of the project shares: the colour-blind-safe Okabe–Ito palette, the
same colour for a baseline in every figure, labelled axes with units, sized for a single column
(3.4 in wide), and the atomic PNG + PDF writer."""

from __future__ import annotations

import math
from pathlib import Path

import matplotlib as mpl
import numpy as np
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.ticker import FormatStrFormatter, LogLocator, NullFormatter

from otb_diag.io.atomic import write_with
from otb_diag.maths.estimators.registry import families, family_of

# Okabe & Ito (2008), safe for the common colour-vision deficiencies.
OKABE_ITO = {
    "black": "#000000",
    "orange": "#E69F00",
    "sky": "#56B4E9",
    "green": "#009E73",
    "yellow": "#F0E442",
    "blue": "#0072B2",
    "vermillion": "#D55E00",
    "purple": "#CC79A7",
}

# A baseline family keeps its colour in every figure: the registry's families, in registration
# order (none, mean, grpo, rloo, optseq, otb, then any registered later), take these in turn.
FAMILY_PALETTE = tuple(
    OKABE_ITO[c]
    for c in ("black", "sky", "blue", "green", "orange", "vermillion", "yellow", "purple")
)
PASS_COLOR, FAIL_COLOR = OKABE_ITO["green"], OKABE_ITO["vermillion"]

COLUMN_WIDTH_IN = 3.4

STYLE = {
    "figure.figsize": (COLUMN_WIDTH_IN, 2.5),
    "figure.dpi": 200,
    "savefig.dpi": 200,
    "savefig.bbox": "tight",
    "font.size": 8,
    "axes.titlesize": 8,
    "axes.labelsize": 8,
    "legend.fontsize": 6.5,
    "xtick.labelsize": 7,
    "ytick.labelsize": 7,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "axes.grid": True,
    "grid.alpha": 0.25,
    "lines.linewidth": 1.2,
    "pdf.fonttype": 42,  # embed TrueType so reviewers can select the text
}


def baseline_color(name: str) -> str:
    """Colour of a baseline's registry family (`otb-loo` and `otb-true` share `otb`'s); a name
    the registry does not know gets the last colour of the palette."""
    family, known = family_of(name), families()
    if family is None:
        return FAMILY_PALETTE[-1]
    return FAMILY_PALETTE[known.index(family) % len(FAMILY_PALETTE)]


def new_figure(height_in: float = 2.5, width_in: float = COLUMN_WIDTH_IN) -> tuple[Figure, Axes]:
    """A bare Figure (no pyplot state, so no GUI backend is ever touched) in the shared style."""
    with mpl.rc_context(STYLE):
        fig = Figure(figsize=(width_in, height_in))
        ax = fig.subplots()
    return fig, ax


def save_figure(fig: Figure, out_dir: str | Path, name: str) -> list[Path]:
    """Write `name.png` and `name.pdf` into `out_dir`; returns the paths."""
    paths = []
    with mpl.rc_context(STYLE):
        for ext in ("png", "pdf"):
            path = Path(out_dir) / f"{name}.{ext}"
            write_with(path, lambda p, ext=ext: fig.savefig(p, format=ext))
            paths.append(path)
    return paths


DODGE = 0.05  # log2 units between neighbouring series' points at one x


def dodged(values, k: int, count: int) -> np.ndarray:
    """`values` (`[n]`, on a log axis) of series `k` of `count`, shifted by `DODGE` log2 units
    per series about their place, so that series with equal values (mean and rloo share their
    knee: rloo's advantages are mean's times N/(N−1), which the noise scale does not see; two
    arms that reached a target at one point) stay visible side by side."""
    return np.asarray(values, dtype=float) * 2.0 ** ((k - (count - 1) / 2) * DODGE)


PLAIN_DECADES = 3  # wider log ranges keep matplotlib's 10^n ticks (1-2-5 would thin to none)


def plain_log_ticks(axis) -> None:
    """Log-axis ticks at 1, 2, 5 × 10^n written plainly (0.05, 0.1, 0.2), so a range narrower
    than a decade still gets labels, the view widened to the ticks on either side of the data
    (a lowest point of 593 under a first tick of 1,000 could not be read); where that leaves
    fewer than `FEW_TICKS` labels in view (2,000 to 5,000 was labelled at its two ends only),
    the next denser multiples of `DENSER` (2,000, 3,000, 4,000, 5,000); over more than
    `PLAIN_DECADES` decades, matplotlib's own."""
    low, high = axis.get_view_interval()
    if low > 0 and math.log10(high) - math.log10(low) > PLAIN_DECADES:
        return
    subs = DENSER[0]
    if low > 0:  # the limits set, not autoscaled again by what is drawn later
        low, high = tick_at_or_below(low), tick_at_or_above(high)
        set_lim = axis.axes.set_ylim if axis is axis.axes.yaxis else axis.axes.set_xlim
        set_lim(low, high)
        for subs in DENSER:  # the first with enough ticks in view
            ticks = LogLocator(subs=subs).tick_values(low, high)
            if sum(low <= t <= high for t in ticks) >= FEW_TICKS:
                break
    axis.set_major_locator(LogLocator(subs=subs))
    axis.set_major_formatter(FormatStrFormatter("%g"))
    axis.set_minor_formatter(NullFormatter())


FEW_TICKS = 3
# Tick multiples of 10^n, sparser first: 1-2-5, every whole one, every half one (1,000 to 2,000
# gets 1,000, 1,500, 2,000).
DENSER = (
    (1.0, 2.0, 5.0),
    tuple(float(k) for k in range(1, 10)),
    tuple(k / 2 for k in range(2, 20)),
)
_PLAIN_TICKS = (1.0, 2.0, 5.0, 10.0)


def tick_at_or_below(x: float) -> float:
    """The largest 1, 2, 5 × 10^n at or below `x > 0`."""
    decade = 10.0 ** math.floor(math.log10(x))
    return max(t * decade for t in _PLAIN_TICKS if t * decade <= x * (1 + 1e-12))


def tick_at_or_above(x: float) -> float:
    """The smallest 1, 2, 5 × 10^n at or above `x > 0`."""
    decade = 10.0 ** math.floor(math.log10(x))
    return min(t * decade for t in _PLAIN_TICKS if t * decade >= x * (1 - 1e-12))
