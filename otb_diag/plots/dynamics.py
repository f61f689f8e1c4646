"""Training-dynamics figures (the OTB paper's figures 1–2, and score against tokens sampled), in
the shared style of plots/style.py.

Every function takes the tidy table `otb-diag dynamics` writes (dynamics.csv: one row per run
and logged step, columns run, step, grad_norm, score, variance_proxy, tokens_sampled, baseline,
group_size) and the per-run results (the rows of collapse.json's `runs`, read by their fields:
`RunMarks`). A run is coloured by its baseline (`baseline_color`; unknown
baselines share the fallback colour) and its line style says its group size; runs that share
both get a colour each.

Every point of the table is drawn (`_series`): on a line beside a neighbour, or as a dot where
it has none (a line of one point shows nothing; a run's last logged norm, after a gap, went
undrawn). Log axes draw what a log axis can: positive finite values on the line; zeros and
negatives (TRL logs `grad_norm = 0.0` when every group had equal rewards) as triangles on the
axis floor, with a note saying so; NaN and ±inf are left out. A panel with nothing to draw says
why instead of failing: the metric not in the log, or no value of it that the axis can draw."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import matplotlib as mpl
import numpy as np
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch
from matplotlib.ticker import MaxNLocator

from otb_diag.io.training_logs import (
    CONTROLLER_PROMPTS,
    MEAN_ENERGY,
    OTB_OVER_MEAN,
    OTB_OVER_MEAN_WITHOUT_TAIL,
    OTB_PREFIX,
)
from otb_diag.maths.noise.budget_stream import SPLIT
from otb_diag.plots.style import (
    COLUMN_WIDTH_IN,
    OKABE_ITO,
    STYLE,
    baseline_color,
    dodged,
    new_figure,
    plain_log_ticks,
)


class RunMarks(Protocol):
    """What the figures read of a run's result (`otb_diag/pipelines/results/dynamics.py:DynamicsRun`
    has these fields)."""

    @property
    def run(self) -> str: ...
    @property
    def collapse_step(self) -> int | None: ...
    @property
    def warning_step(self) -> int | None: ...
    @property
    def tokens_to_target(self) -> float | None: ...
    @property
    def variance_proxy_kind(self) -> str: ...


GROUP_SIZE_STYLES = ("-", "--", ":", "-.")
# Beside the axes, off the curves (a legend inside covered the top of the log-scale panels).
LEGEND_BESIDE = {"loc": "upper left", "bbox_to_anchor": (1.0, 1.0), "frameon": False}
# What a legend says where the log names no baseline or no group size (it once read "?, N=4").
NO_BASELINE, NO_GROUP_SIZE = "baseline not logged", "N not logged"


def _stacked(height_in: float) -> tuple[Figure, Sequence[Axes]]:
    """Two panels sharing the step axis, in the shared style (no pyplot state)."""
    with mpl.rc_context(STYLE):
        fig = Figure(figsize=(COLUMN_WIDTH_IN, height_in))
        axes = fig.subplots(2, 1, sharex=True)
    return fig, axes


def _identity(rows: pd.DataFrame) -> tuple[str | None, float]:
    """A run's baseline (None when the log names none) and group size (NaN when unknown)."""
    baseline = rows["baseline"].dropna()
    return (str(baseline.iloc[0]) if len(baseline) else None), float(rows["group_size"].iloc[0])


def _styles(table: pd.DataFrame) -> dict[str, dict[str, str]]:
    """Colour by baseline and line style by group size, per run (in order of appearance).
    When two runs share both (a learning-rate sweep, seeds), each run gets its own colour
    instead, in the palette's order, and past the palette's 8 colours the next line style, so
    no two lines look alike (11 runs had repeated 3 colours)."""
    sizes = sorted({s for s in table["group_size"].dropna().unique()})
    identities = {run: _identity(rows) for run, rows in table.groupby("run", sort=False)}
    keys = [(b, None if np.isnan(n) else n) for b, n in identities.values()]
    by_run = len(set(keys)) < len(keys)
    palette = list(OKABE_ITO.values())
    styles = {}
    for i, (run, (baseline, size)) in enumerate(identities.items()):
        if by_run:
            color = palette[i % len(palette)]
            linestyle = GROUP_SIZE_STYLES[i // len(palette) % len(GROUP_SIZE_STYLES)]
        else:
            color = baseline_color(baseline or "")
            linestyle = (
                GROUP_SIZE_STYLES[sizes.index(size) % len(GROUP_SIZE_STYLES)]
                if size in sizes
                else "-"
            )
        styles[run] = {"color": color, "linestyle": linestyle}
    return styles


def integer_steps(ax: Axes) -> None:
    """Ticks at whole training steps only (a run of 2 steps had ticks at 1.2, 1.4, …)."""
    ax.xaxis.set_major_locator(MaxNLocator(integer=True, min_n_ticks=1))


def _mark(ax: Axes, step: float | None, color: str, linestyle: str) -> None:
    if step is not None and np.isfinite(step):
        ax.axvline(step, color=color, linestyle=linestyle, linewidth=0.9)


def _results(runs: Sequence[RunMarks]) -> dict[str, RunMarks]:
    return {r.run: r for r in runs}


def _series(ax: Axes, x, y, *, bridge: bool = False, log: bool = False, **style) -> None:
    """`y` against `x` (`[n]` each) as a line in `style`, every point the axis can draw shown:
    beside a neighbour on the line, or as a dot where it has none. `bridge`: a NaN is a step
    that logged nothing, which the line runs across (under the knee controller only an
    update's last batch logs `grad_norm`); else a NaN breaks the line (no value there, as
    OTB/mean where every group's rewards were equal). `log`: a log axis, on which values ≤ 0
    break the line too (`_log_panel` draws them on its floor)."""
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    bridged = bridge and bool(np.isnan(y).any())
    if bridged:
        kept = ~np.isnan(y)
        x, y = x[kept], y[kept]
    shown = np.isfinite(x) & np.isfinite(y) & ((y > 0) if log else True)
    y = np.where(shown, y, np.nan)
    # a line run across steps that logged nothing marks the steps that did
    ax.plot(x, y, **style, **({"marker": "o", "markersize": 2} if bridged else {}))
    before, after = np.r_[False, shown[:-1]], np.r_[shown[1:], False]
    lone = shown & ~before & ~after  # no neighbour on the line: a dot, or it is not seen
    alpha = {"alpha": style["alpha"]} if "alpha" in style else {}
    ax.plot(x[lone], y[lone], linestyle="none", marker="o", markersize=2.5, **_color(style),
            **alpha)  # fmt: skip


def _log_panel(ax: Axes, lines: list[tuple[pd.DataFrame, str, dict, str | None]], what: str):
    """Draw `(rows, column, style, label)` lines on a log y axis (see the module docstring),
    bridging NaN (`_series`). With no line, or no positive value, the panel says so."""
    values = [rows[column].to_numpy(dtype=float) for rows, column, _, _ in lines]
    positive = np.concatenate([v[np.isfinite(v) & (v > 0)] for v in values] or [np.empty(0)])
    if positive.size == 0:
        for _rows, _, style, label in lines:  # keep the legend entries
            ax.plot([], [], label=label, **style)
        ax.text(0.5, 0.5, f"no positive {what} logged", transform=ax.transAxes, ha="center",
                va="center", fontsize=6)  # fmt: skip
        return
    floor = float(positive.min()) / 3
    on_floor = 0
    for (rows, _, style, label), v in zip(lines, values, strict=True):
        steps = rows["step"].to_numpy(dtype=float)
        _series(ax, steps, v, bridge=True, log=True, label=label, **style)
        low = np.isfinite(v) & (v <= 0)
        if low.any():
            on_floor += int(low.sum())
            ax.plot(
                steps[low],
                np.full(int(low.sum()), floor),
                linestyle="none",
                marker="v",
                markersize=3,
                **_color(style),
            )
    ax.set_yscale("log")
    ax.autoscale_view()
    ax.set_ylim(bottom=floor / 1.5)
    plain_log_ticks(ax.yaxis)
    if on_floor:
        ax.text(
            0.99,
            0.98,
            f"▼ {on_floor} zero or negative {what} values, drawn on the axis floor",
            transform=ax.transAxes,
            ha="right",
            va="top",
            fontsize=5.5,
        )


def _color(style: dict) -> dict:
    return {"color": style["color"]}


def fig1_grad_norm_and_score(table: pd.DataFrame, runs: Sequence[RunMarks]) -> Figure:
    """Gradient norm (log scale) above, score below, against step; one line per run, its
    collapse step (if any) as a dotted vertical line in the run's colour on both panels. With a
    `score_smoothed` column (what `otb-diag dynamics` writes) the score panel draws it as the
    line, the per-step score faint behind it (a run too short for the mean: its per-step line)."""
    styles, results = _styles(table), _results(runs)
    fig, (top, bottom) = _stacked(4.0)
    with mpl.rc_context(STYLE):
        groups = list(table.groupby("run", sort=False))
        _log_panel(
            top, [(rows, "grad_norm", styles[run], run) for run, rows in groups], "grad_norm"
        )
        smoothed = False  # whether some run's score is drawn as its trailing mean
        for run, rows in groups:
            style = styles[run]
            # A step's score is a few samples' mean: the trailing mean reads better. A run
            # shorter than the mean's window has none and keeps its per-step line.
            if "score_smoothed" in rows and np.isfinite(rows["score_smoothed"]).any():
                smoothed = True
                _series(bottom, rows["step"], rows["score"], alpha=0.25, linewidth=0.6,
                        **_color(style))  # fmt: skip
                _series(bottom, rows["step"], rows["score_smoothed"], **style)
            else:
                _series(bottom, rows["step"], rows["score"], **style)
            for ax in (top, bottom):
                _mark(ax, results[run].collapse_step, style["color"], ":")
        top.set_ylabel("gradient norm ‖g‖")
        top.set_title("Gradient norm and score (dotted: detected collapse)")
        top.legend(**LEGEND_BESIDE)
        bottom.set_ylabel("score (mean reward)")
        if smoothed:
            bottom.set_title("faint: each step; line: trailing mean (--smooth points)", fontsize=6)
        bottom.set_xlabel("training step")
        integer_steps(bottom)  # shared: every panel's step axis
    return fig


def fig2_variance_and_grad_norm(table: pd.DataFrame, runs: Sequence[RunMarks]) -> Figure:
    """The variance proxy (log scale) above and the gradient norm (log scale) below, against
    step; the variance warning as a dashed line, the collapse as a dotted one."""
    styles, results = _styles(table), _results(runs)
    fig, (top, bottom) = _stacked(4.0)
    with mpl.rc_context(STYLE):
        groups = list(table.groupby("run", sort=False))
        kinds = sorted({r.variance_proxy_kind for r in runs} - {"none"})
        proxy_lines = [(rows, "variance_proxy", styles[run], run) for run, rows in groups]
        _log_panel(top, proxy_lines, "variance proxy" if kinds else "variance proxy (none)")
        _log_panel(
            bottom, [(rows, "grad_norm", styles[run], None) for run, rows in groups], "grad_norm"
        )
        for run, _ in groups:
            style, result = styles[run], results[run]
            for ax in (top, bottom):
                _mark(ax, result.warning_step, style["color"], "--")
                _mark(ax, result.collapse_step, style["color"], ":")
        top.set_ylabel("variance proxy")
        top.set_title(
            "Variance proxy and gradient norm (dashed: warning, dotted: collapse)\n"
            + "proxy: "
            + (", ".join(kinds) or "none"),
            fontsize=6.5,
        )
        top.legend(**LEGEND_BESIDE)
        bottom.set_ylabel("gradient norm ‖g‖")
        bottom.set_xlabel("training step")
        integer_steps(bottom)  # shared: every panel's step axis
    return fig


def _run_label(rows: pd.DataFrame) -> str:
    """`baseline, N=n` for the score-against-tokens legend, saying what the log lacks
    ("baseline not logged, N=4": a log that records no baseline, and no split to read it
    from)."""
    baseline, size = _identity(rows)
    n = f"N={int(size)}" if np.isfinite(size) else NO_GROUP_SIZE
    return f"{baseline or NO_BASELINE}, {n}"


def fig_score_vs_tokens(
    table: pd.DataFrame, runs: Sequence[RunMarks], target: float | None
) -> Figure:
    """Score against the running total of sampled tokens, one line per run labelled
    `baseline, N=n` (the run name added when two runs share a label), with the target score as
    a dotted line and each run's tokens-to-target as a marker."""
    styles, results = _styles(table), _results(runs)
    labels = {run: _run_label(rows) for run, rows in table.groupby("run", sort=False)}
    shared = {label for label in labels.values() if list(labels.values()).count(label) > 1}
    fig, ax = new_figure(height_in=2.6)
    with mpl.rc_context(STYLE):
        plotted = 0
        for run, rows in table.groupby("run", sort=False):
            rows = rows[np.isfinite(rows["tokens_sampled"])]
            if rows.empty:
                continue
            label = labels[run] + (f" ({run})" if labels[run] in shared else "")
            _series(ax, rows["tokens_sampled"], rows["score"], label=label, **styles[run])
            reached = results[run].tokens_to_target
            if reached is not None and target is not None:
                ax.plot([reached], [target], marker="o", markersize=3, color=styles[run]["color"])
            plotted += 1
        if target is not None:
            ax.axhline(target, color="0.4", linestyle=":", linewidth=0.9)
        if plotted:
            ax.legend(**LEGEND_BESIDE)
        else:
            ax.text(0.5, 0.5, "no run logs sampled tokens", transform=ax.transAxes, ha="center")
        ax.ticklabel_format(axis="x", style="sci", scilimits=(0, 3))
        ax.set_xlabel("tokens sampled (running total)")
        ax.set_ylabel("score (mean reward)")
        ax.set_title(
            "Score against tokens sampled" + (f" (target {target:g})" if target is not None else "")
        )
    return fig


@dataclass(frozen=True)
class LivePanel:
    """One panel of the live figure: the metric it draws (its key as logged, under `otb/`),
    what it is in words (the panel's title, above the key), its axis label, and whether its
    axis is logarithmic."""

    key: str
    words: str
    label: str
    log: bool = False


# The live diagnostics' curves (docs/live.md): where the dashboard shows a metric of the
# quantity, its key (`io/training_logs.py` names it for the dashboard's headline and here: the
# panel once drew `token_total_power`'s ratio beside a dashboard showing `proxy2_total_power`'s);
# the group CV is in the full record only.
LIVE_PANELS = (
    LivePanel(OTB_PREFIX + MEAN_ENERGY, "mean realized energy W(τ) of a response",
              "mean energy W(τ)", log=True),
    LivePanel(OTB_PREFIX + "energy/group_cv_median",
              "median over groups of the energies' coefficient of variation",
              "energy CV\nin a group"),
    LivePanel(OTB_PREFIX + OTB_OVER_MEAN,
              "OTB's variance proxy over the mean baseline's (proxy2_total_power)",
              "OTB / mean"),
)  # fmt: skip
# A panel's second series, as crosses where it differs from the first: OTB/mean less the part
# verl's zero tail adds (docs/live.md).
LIVE_WITHOUT_TAIL = {OTB_PREFIX + OTB_OVER_MEAN: OTB_PREFIX + OTB_OVER_MEAN_WITHOUT_TAIL}
TAIL_MOVES = 1e-3  # a relative difference below this is no move of the ratio
# What a panel says where no run has a value of its metric (a column absent, or NaN at every
# step: a log concatenated with a run that had it, a trainer that leaves non-finite values out).
NO_VALUE = "no value of {key} in the log\n(the live diagnostics log it, docs/live.md)"


def fig_live_otb(table: pd.DataFrame, runs: Sequence[RunMarks]) -> Figure:
    """The `otb/` metrics a trainer logged (`otb_diag.integrations`) beside its gradient norm,
    against step, each panel titled with what it draws and its key (`LIVE_PANELS`): ‖g‖ and the
    mean energy on log axes, the within-group energy CV and OTB's variance proxy over the mean
    baseline's (a line at 1: below it OTB cuts the variance) on linear ones; the collapse as a
    dotted line. The ratio's panel marks with × the steps where, without the part verl's zero
    tail adds (where logged), it would differ, and says why its line has gaps: steps where
    every group's rewards were equal, so the mean baseline's proxy is 0 and there is no ratio.
    A panel with nothing to draw says why (`NO_VALUE`, or no positive value on a log
    axis)."""
    styles, results = _styles(table), _results(runs)
    groups = list(table.groupby("run", sort=False))
    with mpl.rc_context(STYLE):
        fig = Figure(figsize=(COLUMN_WIDTH_IN, 1.6 * (1 + len(LIVE_PANELS))))
        # room above each panel for its two-line title
        axes = fig.subplots(1 + len(LIVE_PANELS), 1, sharex=True, gridspec_kw={"hspace": 0.75})
        _log_panel(axes[0], [(rows, "grad_norm", styles[r], r) for r, rows in groups], "grad_norm")
        _panel_title(axes[0], "gradient norm the trainer logged", "grad_norm")
        axes[0].set_ylabel("‖g‖")
        for ax, panel in zip(axes[1:], LIVE_PANELS, strict=True):
            present = [(r, rows) for r, rows in groups if panel.key in rows]
            values = [rows[panel.key].to_numpy(dtype=float) for _, rows in present]
            if not any(np.isfinite(v).any() for v in values):
                _say_empty(ax, NO_VALUE.format(key=panel.key))
            elif panel.log:
                lines = [(rows, panel.key, styles[r], None) for r, rows in present]
                _log_panel(ax, lines, panel.key)
            else:
                for run, rows in present:
                    _series(ax, rows["step"], rows[panel.key], **styles[run])
            if panel.key in LIVE_WITHOUT_TAIL and present:
                _ratio_notes(ax, present, panel.key, styles)
            _panel_title(ax, panel.words, panel.key)
            ax.set_ylabel(panel.label)
        for run, _ in groups:
            for ax in axes:
                _mark(ax, results[run].collapse_step, styles[run]["color"], ":")
        fig.suptitle("Live OTB diagnostics beside the gradient norm", fontsize=6.5)
        axes[0].legend(**LEGEND_BESIDE)
        axes[-1].set_xlabel("training step")
        integer_steps(axes[-1])  # shared: every panel's step axis
    return fig


def _panel_title(ax: Axes, words: str, key: str) -> None:
    """What a panel draws: its words, and below them the key it is logged under."""
    ax.set_title(f"{words}\n{key}", fontsize=5.5, loc="left")


def _say_empty(ax: Axes, why: str) -> None:
    ax.text(0.5, 0.5, why, transform=ax.transAxes, ha="center", va="center", fontsize=5.5)
    ax.set_yticks([])


def _ratio_notes(
    ax: Axes, present: list[tuple[str, pd.DataFrame]], column: str, styles: dict[str, dict]
) -> None:
    """The OTB/mean panel's extras: the line at 1, a × where the ratio without the zero tail's
    part differs (by more than `TAIL_MOVES`), and a note under the panel on the marks and on
    the gaps (steps with no ratio between logged ones)."""
    ax.axhline(1.0, color="0.5", linewidth=0.6, linestyle="--")
    without, moved, gaps = LIVE_WITHOUT_TAIL[column], 0, 0
    for run, rows in present:
        ratio = rows[column].to_numpy(dtype=float)
        logged = np.flatnonzero(np.isfinite(ratio))
        if len(logged):
            gaps += int(np.isnan(ratio[logged[0] : logged[-1] + 1]).sum())
        if without in rows:
            other = rows[without].to_numpy(dtype=float)
            with np.errstate(invalid="ignore"):
                differs = (
                    np.isfinite(other)
                    & np.isfinite(ratio)
                    & (np.abs(other - ratio) > TAIL_MOVES * np.abs(ratio))
                )
            ax.plot(rows["step"].to_numpy()[differs], other[differs], linestyle="none",
                    marker="x", markersize=3.5, color=styles[run]["color"])  # fmt: skip
            moved += int(differs.sum())
    notes = ["dashed: 1, OTB's proxy equal to the mean baseline's"]
    if moved:
        notes.append(f"×: without verl's zero tail ({moved} step(s) it moves)")
    if gaps:
        notes.append(f"gaps: {gaps} step(s) with equal rewards in every group (no ratio)")
    # under the step axis' label: the panel's data may reach any height
    ax.text(0.0, -0.6, "\n".join(notes), transform=ax.transAxes, ha="left", va="top",
            fontsize=5.5)  # fmt: skip


def fig_pooled_noise_scale(budget: pd.DataFrame, table: pd.DataFrame) -> Figure:
    """The noise scale pooled over the split steps so far (`pipelines/pooled_budget.py`, the
    window pool), against step: one panel per run, per estimator (coloured as its baseline) its
    95 % band and, where `|G|²` is resolved from 0 (`pooling.Pooled.resolved`), the knee B as
    a filled dot on a line; where it is not, B is no estimate (a `|G|²` of 1e-13 makes it 1e13)
    and only the bound the sentence gives is drawn, a hollow dot at the band's low end (the band
    runs off the top: the knee is only bounded below), or, where `|G|²` is ≤ 0 over its whole
    interval (no signal measurable, no bound), a hollow ▲ at the top; a step pooled from one
    split step has no interval and says so. Log y axis.

    The prompts the run trained with, from `table` (dynamics.csv) at every step: P, the
    prompts a step sampled (`split/prompts`), dashed; where a knee controller ran, the prompts
    of the update each step's batch belonged to (`controller/prompts_per_update`), solid, as
    applied. Where that line sits under the band the run trains below its knee. The legend gives
    each estimator as its band, and says what the lines and the kinds of dot drawn mean."""
    window = budget[budget["pool"] == "window"]
    runs = list(window.groupby("run", sort=False))
    with mpl.rc_context(STYLE):
        fig = Figure(figsize=(COLUMN_WIDTH_IN, 2.2 * len(runs)))
        # Room between panels for a panel's step ticks above the next one's title.
        grid = fig.subplots(len(runs), 1, squeeze=False, gridspec_kw={"hspace": 0.5})
        axes = np.atleast_1d(grid[:, 0])
        for ax, (run, rows) in zip(axes, runs, strict=True):
            drawn = _pooled_panel(ax, rows, table[table["run"] == run])
            ax.set_title(f"{run}: pooled noise scale (prompts an update)", fontsize=6.5)
            bands = [Patch(facecolor=baseline_color(str(e)), alpha=BAND_ALPHA,
                           label=f"{e}: B's 95 % interval")
                     for e in rows["estimator"].unique()]  # fmt: skip
            marks = [h for kind, h in POOLED_MARKERS.items() if drawn[kind]]
            ax.legend(handles=[*bands, *ax.get_legend_handles_labels()[0], *marks],
                      **LEGEND_BESIDE)  # fmt: skip
            integer_steps(ax)
        axes[-1].set_xlabel("training step")
    return fig


BAND_ALPHA = 0.25  # a band's, and its estimator's swatch in the legend
# What the pooled noise scale's dots mean, in its legend (those a panel draws).
POOLED_MARKERS = {
    "knee": Line2D([], [], color="0.3", marker="o", ms=3, label="knee B (|G|² resolved)"),
    "bound": Line2D([], [], color="0.3", marker="o", ms=3, mfc="white", ls="none",
                    label="knee ≥ this (|G|² not resolved)"),
    "no_signal": Line2D([], [], color="0.3", marker="^", ms=3.5, mfc="white", ls="none",
                        label="no signal measurable\n(|G|² ≤ 0 over its interval)"),
    "one_step": Line2D([], [], color="0.5", marker="|", ms=5, ls="none",
                       label="one split step: no interval yet"),
}  # fmt: skip
PROMPTS = OTB_PREFIX + SPLIT + "prompts"  # the prompts a step sampled, logged with the split
UPDATE_PROMPTS = OTB_PREFIX + CONTROLLER_PROMPTS


def _pooled_panel(ax: Axes, rows: pd.DataFrame, steps: pd.DataFrame) -> dict[str, bool]:
    """One run's estimators (see `fig_pooled_noise_scale`) and the prompts it trained with,
    from its rows of dynamics.csv, `steps`; which kinds of dot were drawn
    (`POOLED_MARKERS`)."""
    trained = _prompts_lines(steps, rows)
    resolved = rows["resolved"].to_numpy(dtype=float) > 0
    drawn = [rows["noise_scale"][resolved], rows["noise_scale_low"], rows["noise_scale_high"]]
    drawn += [y for _, y, _ in trained]  # an unresolved B is not drawn, so it sets no limit
    values = np.concatenate([np.asarray(v, dtype=float) for v in drawn])
    positive = values[np.isfinite(values) & (values > 0)]
    top = 3 * positive.max() if positive.size else 10.0  # an open band runs past the top
    floor = positive.min() / 2 if positive.size else 0.1
    kinds = dict.fromkeys(POOLED_MARKERS, False)
    for estimator, lines in rows.groupby("estimator", sort=False):
        color = baseline_color(str(estimator))
        step = lines["step"].to_numpy(dtype=float)
        # One step has no interval (its band would be the whole axis): bands from two on.
        spread = lines["effective_steps"].to_numpy(dtype=float) > 1
        low = lines["noise_scale_low"].to_numpy(dtype=float)
        high = np.where(np.isfinite(lines["noise_scale_high"]), lines["noise_scale_high"], top)
        band = spread & np.isfinite(low)  # an infinite low end: no signal, no band (below)
        ax.fill_between(step, np.where(band, low, np.nan), np.where(band, high, np.nan),
                        color=color, alpha=BAND_ALPHA, lw=0)  # fmt: skip
        knee = lines["resolved"].to_numpy(dtype=float) > 0
        point = np.where(knee, lines["noise_scale"], np.nan)
        _series(ax, step, point, log=True, color=color)
        ax.plot(step[knee], point[knee], "o", ms=3, color=color)
        bound = ~knee & (low > 0) & np.isfinite(low)  # "the knee is at least low"
        ax.plot(step[bound], low[bound], "o", ms=3, mfc="white", color=color)
        no_signal = ~knee & np.isposinf(low)  # 1/B's whole interval ≤ 0: B off the top
        ax.plot(step[no_signal], np.full(int(no_signal.sum()), top / 1.5), "^", ms=3.5,
                mfc="white", color=color, clip_on=False)  # fmt: skip
        one_step = ~spread & ~knee
        ax.plot(step[one_step], np.full(int(one_step.sum()), floor * 1.1), "|", ms=5,
                color="0.5")  # fmt: skip
        kinds["knee"] |= bool(knee.any())
        kinds["bound"] |= bool(bound.any())
        kinds["no_signal"] |= bool(no_signal.any())
        kinds["one_step"] |= bool(one_step.any())
    if not (kinds["knee"] or kinds["bound"] or kinds["no_signal"]):
        ax.text(0.5, 0.9, "no knee and no bound yet: one split step has no interval",
                transform=ax.transAxes, ha="center", fontsize=5.5)  # fmt: skip
    for x, y, style in trained:
        ax.plot(x, y, drawstyle="steps-mid", **style)
    every = rows["step"].to_numpy(dtype=float)
    ax.set_xlim(every.min() - 0.5, every.max() + 0.5)  # one step too: a whole-number tick
    ax.set_yscale("log")
    ax.set_ylim(floor, top / 1.5)
    ax.set_ylabel("noise scale B\n(prompts an update)")
    return kinds


def _prompts_lines(steps: pd.DataFrame, rows: pd.DataFrame) -> list[tuple[np.ndarray, ...]]:
    """`(x, y, style)` of the prompts a run trained with at each of its `steps` (its rows of
    dynamics.csv): the prompts a step sampled (`PROMPTS`; the pooled P̄ of budget.csv's
    `rows` where the table has none) and, where a knee controller logged them, the prompts of
    the update each step belonged to (`UPDATE_PROMPTS`), as applied."""
    lines = []
    sampled = _logged(steps, PROMPTS)
    update = _logged(steps, UPDATE_PROMPTS)
    if sampled is None:  # a table without the split's P: the pooled P̄ at each split step
        p = rows[["step", "prompts_per_step"]].drop_duplicates("step")
        sampled = (p["step"].to_numpy(dtype=float), p["prompts_per_step"].to_numpy(dtype=float))
    if len(sampled[0]):
        label = "P, prompts a step sampled" if update is not None else "P, the run's prompts a step"
        lines.append((*sampled, {"color": "0.3", "linestyle": "--", "linewidth": 0.8,
                                 "label": label + _constant(sampled[1])}))  # fmt: skip
    if update is not None:
        lines.append((*update, {"color": "0.1", "linewidth": 1.0,
                                "label": "prompts an update took\n(knee controller, as applied)"
                                + _constant(update[1])}))  # fmt: skip
    return lines


def _logged(steps: pd.DataFrame, key: str) -> tuple[np.ndarray, np.ndarray] | None:
    """`(step, value)` where `key` is logged with a finite value; None where it never is."""
    if key not in steps:
        return None
    rows = steps[np.isfinite(steps[key].to_numpy(dtype=float))]
    if rows.empty:
        return None
    return rows["step"].to_numpy(dtype=float), rows[key].to_numpy(dtype=float)


def _constant(values: np.ndarray) -> str:
    """The label's ending where every value is one whole number: " = 8"; else none."""
    first = values[0]
    return f" = {first:.0f}" if (values == first).all() and first == round(first) else ""


class ArmMarks(Protocol):
    """What the comparison figure reads of an arm
    (`otb_diag/pipelines/results/dynamics.py:DynamicsArm` has these fields)."""

    @property
    def arm(self) -> str: ...
    @property
    def baseline(self) -> str | None: ...
    @property
    def group_size(self) -> int | None: ...
    @property
    def collapse_steps(self) -> list[int | None]: ...
    @property
    def runs(self) -> list[str]: ...
    @property
    def reached(self) -> int: ...
    @property
    def tokens_to_target_mean(self) -> float | None: ...
    @property
    def tokens_to_target_low(self) -> float | None: ...
    @property
    def tokens_to_target_high(self) -> float | None: ...
    @property
    def updates_to_target(self) -> list[int | None]: ...
    @property
    def updates_to_target_mean(self) -> float | None: ...
    @property
    def updates_to_target_low(self) -> float | None: ...
    @property
    def updates_to_target_high(self) -> float | None: ...


def _arm_styles(arms: Sequence[ArmMarks]) -> dict[str, dict[str, str]]:
    """A colour per arm, its baseline's where no two arms share a baseline, else the palette's
    in the arms' order (grpo at N = 4 and at N = 16 shared one blue, told apart by a line style
    the comparison's markers do not show); the line style says the group size."""
    baselines = [a.baseline for a in arms]
    by_baseline = len(set(baselines)) == len(baselines)
    sizes = sorted({a.group_size for a in arms if a.group_size is not None})
    palette = list(OKABE_ITO.values())
    return {
        a.arm: {
            "color": baseline_color(a.baseline or "") if by_baseline else palette[i % len(palette)],
            "linestyle": GROUP_SIZE_STYLES[sizes.index(a.group_size) % len(GROUP_SIZE_STYLES)]
            if a.group_size in sizes
            else "-",
        }
        for i, a in enumerate(arms)
    }


def fig_baseline_comparison(
    table: pd.DataFrame, arms: Sequence[ArmMarks], arm_of: dict[str, str], target: float | None
) -> Figure:
    """The comparison at equal tokens, three panels against the running total of sampled
    tokens: every run's trailing-mean score (with the target as a dotted line) and gradient
    norm (log scale), coloured by its arm (`arm_of`: run -> arm), a cross at a run's detected
    collapse; below, per arm, the tokens each run needed to reach the target (open dots), their
    mean (filled) and its 95 % interval over the seeds (bar), k/n the runs that reached it."""
    styles = _arm_styles(arms)
    collapse = {run: step for a in arms for run, step in zip(a.runs, a.collapse_steps, strict=True)}
    with mpl.rc_context(STYLE):
        fig = Figure(figsize=(COLUMN_WIDTH_IN, 5.0))
        top, middle, bottom = fig.subplots(3, 1, sharex=True, height_ratios=(3, 2.4, 1.4))
        labelled: set[str] = set()
        positive = 0  # gradient norms a log axis can draw
        for run, rows in table.groupby("run", sort=False):
            rows = rows[np.isfinite(rows["tokens_sampled"])]
            style, arm = styles[arm_of[run]], arm_of[run]
            column = "score_smoothed" if rows["score_smoothed"].notna().any() else "score"
            _series(top, rows["tokens_sampled"], rows[column], linewidth=0.7, alpha=0.8,
                    label=None if arm in labelled else arm, **style)  # fmt: skip
            labelled.add(arm)
            g = rows["grad_norm"].to_numpy(dtype=float)
            # a log axis: 0 (all rewards equal) left out; NaN (no update closed) bridged
            _series(middle, rows["tokens_sampled"], g, bridge=True, log=True, linewidth=0.5,
                    alpha=0.8, **style)  # fmt: skip
            positive += int((np.isfinite(g) & (g > 0)).sum())
            hit = rows[rows["step"] == collapse[run]]
            for ax, name in ((top, column), (middle, "grad_norm")):
                ax.plot(hit["tokens_sampled"], hit[name], linestyle="none", marker="x",
                        markersize=4, color=style["color"])  # fmt: skip
        if target is not None:
            top.axhline(target, color="0.4", linestyle=":", linewidth=0.9)
        _target_panel(bottom, arms, styles, target)
        if positive:
            middle.set_yscale("log")
            middle.autoscale_view()
            plain_log_ticks(middle.yaxis)
        else:
            middle.text(0.5, 0.5, "no positive grad_norm logged", transform=middle.transAxes,
                        ha="center")  # fmt: skip
        top.set_ylabel("score (trailing mean)")
        top.set_title("Baselines at equal tokens (×: detected collapse)", fontsize=6.5)
        top.legend(**LEGEND_BESIDE)
        middle.set_ylabel("gradient norm ‖g‖")
        bottom.set_xlabel("tokens sampled (running total)")
        bottom.ticklabel_format(axis="x", style="sci", scilimits=(0, 3))
    return fig


def _target_panel(
    ax: Axes, arms: Sequence[ArmMarks], styles: dict[str, dict[str, str]], target: float | None
) -> None:
    """One row per arm: each run's tokens to `target` (open dots), their mean (filled dot) with
    its interval over the seeds (bar), and k/n, the runs that reached it."""
    ax.set_yticks(range(len(arms)), [a.arm for a in arms], fontsize=5.5)
    ax.set_ylim(len(arms) - 0.5, -0.5)
    if target is None:
        ax.text(0.5, 0.5, "no --target: no tokens to target", transform=ax.transAxes, ha="center")
        return
    ax.set_title(f"tokens to score {target:g}: runs, mean, 95 % t interval", fontsize=6)
    for i, a in enumerate(arms):
        color = styles[a.arm]["color"]
        reached = [t for t in a.tokens_to_target if t is not None]
        marker = ARM_MARKERS[i % len(ARM_MARKERS)]
        ax.plot(reached, [i] * len(reached), linestyle="none", marker=marker, markersize=3,
                markerfacecolor="none", color=color)  # fmt: skip
        mean, low, high = a.tokens_to_target_mean, a.tokens_to_target_low, a.tokens_to_target_high
        if mean is None:
            continue
        ax.errorbar([mean], [i], xerr=_bar(mean, low, high), marker=marker, markersize=3,
                    capsize=2, linewidth=1.0, color=color)  # fmt: skip
        ax.annotate(f"{a.reached}/{len(a.runs)}", (mean, i), textcoords="offset points",
                    xytext=(0, 4), fontsize=5, color=color, ha="center")  # fmt: skip


# A marker per arm in the figures that draw arms as points (two arms at one point showed as
# one dot): the filled mean and its runs' hollow dots take the arm's.
ARM_MARKERS = ("o", "s", "^", "D", "v", "P", "X", "<", ">", "*")


def fig_steps_vs_tokens(arms: Sequence[ArmMarks], target: float | None) -> Figure:
    """Optimizer updates against tokens sampled to reach `target`, every arm on one plot: each
    run that reached it (hollow), the arm's mean over those runs (filled) with its 95 % t
    interval on both axes, k/n in the legend; log axes with labelled ticks (`plain_log_ticks`).
    An arm keeps its marker (`ARM_MARKERS`), and its points sit a little apart from the other
    arms' in updates (`style.dodged`, bars with them), so that arms at one point stay visible.
    A larger batch moves an arm down (fewer sequential updates) and right (more tokens): the
    curve (S/S_min − 1)(E/E_min − 1) = 1 of McCandlish et al. (2018), whose knee a batch at
    the noise scale sits at."""
    styles = _arm_styles(arms)
    fig, ax = new_figure(height_in=2.6)
    with mpl.rc_context(STYLE):
        if target is None:
            ax.text(0.5, 0.5, "no --target: no updates or tokens to a target",
                    transform=ax.transAxes, ha="center")  # fmt: skip
            return fig
        shown: list[float] = []
        for k, a in enumerate(arms):
            color, marker = styles[a.arm]["color"], ARM_MARKERS[k % len(ARM_MARKERS)]
            runs = [
                (t, u)
                for t, u in zip(a.tokens_to_target, a.updates_to_target, strict=False)
                if t is not None and u is not None
            ]
            apart = float(dodged([1.0], k, len(arms))[0])  # this arm's factor on the updates
            ax.plot([t for t, _ in runs], [u * apart for _, u in runs], linestyle="none",
                    marker=marker, markersize=3, markerfacecolor="none", color=color,
                    alpha=0.7)  # fmt: skip
            x, y = a.tokens_to_target_mean, a.updates_to_target_mean
            if x is None or y is None:
                continue
            low, high = a.updates_to_target_low, a.updates_to_target_high
            ax.errorbar([x], [y * apart], xerr=_bar(x, a.tokens_to_target_low,
                                                    a.tokens_to_target_high),
                        yerr=_bar(y * apart, *(None if e is None else e * apart
                                               for e in (low, high))),
                        marker=marker, markersize=4, capsize=2, linewidth=1.0, color=color,
                        label=f"{a.arm} ({a.reached}/{len(a.runs)} reached)")  # fmt: skip
            shown += [x, y, *[v for run in runs for v in run]]
        if not shown:
            ax.text(0.5, 0.5, f"no arm reached the score {target:g}", transform=ax.transAxes,
                    ha="center")  # fmt: skip
            return fig
        if min(shown) > 0:  # a log axis: interval ends cut at 0 run off its floor
            ax.set_xscale("log", nonpositive="clip")
            ax.set_yscale("log", nonpositive="clip")
            ax.autoscale_view()
            plain_log_ticks(ax.xaxis)
            plain_log_ticks(ax.yaxis)
        ax.set_xlabel(f"tokens sampled to score {target:g}")
        ax.set_ylabel(f"optimizer updates to score {target:g}")
        ax.set_title("Updates against tokens to the target (bars: 95 % t intervals over seeds)",
                     fontsize=6)  # fmt: skip
        ax.legend(**LEGEND_BESIDE)
    return fig


def _bar(mean: float, low: float | None, high: float | None) -> list[list[float]] | None:
    """An error bar's [[below], [above]] from an interval, None without one."""
    return None if low is None or high is None else [[mean - low], [high - mean]]
