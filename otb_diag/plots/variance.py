"""Figures of the empirical-variance study (maths/variance/paired_draws.py), in the shared style of
`plots.style`.

Each function takes the tidy tables of `variance.empirical_variance` (or a per-token table) and
returns a matplotlib Figure. A baseline keeps its family's colour (`baseline_color`); variants
are told apart by line style or hatch (`-loo` dashed, `-true` dotted, `-seqnorm-true`
dash-dot-dot)."""

from __future__ import annotations

import math

import matplotlib as mpl
import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from otb_diag.maths.estimators.registry import variant_of
from otb_diag.maths.variance.fidelity import correlations
from otb_diag.plots.style import STYLE, baseline_color, dodged, new_figure, plain_log_ticks

LINESTYLES = {"loo": "--", "true": ":", "seqnorm-true": (0, (3, 1, 1, 1, 1, 1))}
HATCHES = {"loo": "//", "true": "..", "seqnorm-true": "xx"}


def _log_y(ax, values: pd.Series) -> None:
    """A log y axis with plain ticks where `values` has a finite positive entry; else a linear
    axis and a note, since matplotlib cannot draw a log axis over nothing but zeros or infinities
    (every variance is 0 when no pool's rewards differ, e.g. a model that never earns a reward;
    the knee is then infinitely far)."""
    v = values.to_numpy(dtype=float)
    if (np.isfinite(v) & (v > 0)).any():
        ax.set_yscale("log")
        plain_log_ticks(ax.yaxis)
        return
    ax.text(
        0.5, 0.5, "every value is 0, infinite or undefined:\ndo the pools' rewards differ?",
        transform=ax.transAxes, ha="center", va="center", fontsize=7,
    )  # fmt: skip


def _rows(table: pd.DataFrame, aggregation: str) -> pd.DataFrame:
    rows = table[table["aggregation"] == aggregation]
    if rows.empty:
        raise ValueError(f"no rows for aggregation '{aggregation}'")
    return rows


def _setting(rows: pd.DataFrame, aggregation: str) -> str:
    """A title's parenthesis: the score mode the rows were measured in (the proxy's and the
    head's figures once shared one title) and the aggregation: "head mode, token-sum"."""
    modes = rows["mode"].dropna().unique() if "mode" in rows else []
    return (f"{modes[0]} mode, " if len(modes) == 1 else "") + aggregation


def _bars(
    point: np.ndarray, low: np.ndarray, high: np.ndarray, top: float = math.inf
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(bar below, bar above, `drawn`), each `[n]`, for `errorbar` from the interval
    `[low, high]` of each `point`: `low` clipped at 0 (a log axis draws the bar to its floor),
    an open `high` at `top` (kept above the point). A row whose interval is NaN or does not
    hold its point gets no bars (`drawn` False), never a negative one, which matplotlib
    refuses."""
    low = np.clip(low, 0, None)
    high = np.where(np.isposinf(high), np.maximum(top, point), high)
    with np.errstate(invalid="ignore"):  # NaN compares False, inf − inf is NaN: not drawn
        drawn = (low <= point) & (point <= high) & np.isfinite(point) & np.isfinite(high)
        return np.where(drawn, point - low, 0.0), np.where(drawn, high - point, 0.0), drawn


def fig_variance_vs_group_size(
    table: pd.DataFrame, aggregation: str = "token-sum", mark: tuple[str, int] | None = ("otb", 4)
) -> Figure:
    """Variance tr Cov(ĝ) against group size N (log–log), one line per baseline, its 95 %
    interval `[ci_low, ci_high]` as error bars (`variance-compare` hands the intervals its
    verdicts read, `pipelines/variance/evidence.py:mode_intervals`: the bootstrap over draws
    widened for the random projection of the scores, wide in head mode; a band over draws alone
    drew head mode far surer than its "not resolved"), each baseline's points shifted a little
    about N (`style.dodged`) so that the bars do not hide one another. `mark = (baseline, N)`:
    the equivalent-N read-off, a dotted line across from that baseline's variance at N to the
    `mean` curve and down to N′ (an arrow to the right edge when N′ is beyond the measured N).

    `table`: columns aggregation, baseline, group_size, variance, ci_low, ci_high,
    equivalent_mean_group_size, and `mode` (named in the title) where it has it."""
    rows = _rows(table, aggregation)
    sizes = sorted(rows["group_size"].unique())
    labels = list(dict.fromkeys(rows["baseline"]))
    fig, ax = new_figure(height_in=2.8)
    with mpl.rc_context(STYLE):
        for k, (label, curve) in enumerate(rows.groupby("baseline", sort=False)):
            curve = curve.sort_values("group_size")
            y = curve["variance"].to_numpy(dtype=float)
            ends = (curve[c].to_numpy(dtype=float) for c in ("ci_low", "ci_high"))
            below, above, _ = _bars(y, *ends)
            ax.errorbar(
                dodged(curve["group_size"], k, len(labels)), y, yerr=[below, above],
                color=baseline_color(label),
                linestyle=LINESTYLES.get(variant_of(label), "-." if variant_of(label) else "-"),
                marker="o", markersize=2.5, capsize=1.2, elinewidth=0.7, label=label,
            )  # fmt: skip
        ax.set_xscale("log", base=2)
        _log_y(ax, rows["variance"])
        ax.set_xticks(sizes, [str(n) for n in sizes])
        ax.minorticks_off()
        if mark is not None:
            _mark_equivalent(ax, rows, *mark)
        ax.set_xlabel("group size N (responses per prompt)")
        ax.set_ylabel(r"variance $\mathrm{tr}\,\mathrm{Cov}(\hat g)$")
        ax.set_title(f"Gradient variance vs. group size ({_setting(rows, aggregation)})")
        ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), frameon=False,
                  title="bars: 95 % intervals", title_fontsize=6)  # fmt: skip
    return fig


def _mark_equivalent(ax, rows: pd.DataFrame, baseline: str, n: int) -> None:
    """Dotted read-off from `baseline`'s variance at N to N′ on the mean curve: its point
    estimate (`N′≈`, or the bound `N′ ≤` the smallest N where the mean curve is already lower
    there); its interval and the verdict read off it are summary.json's. No read-off where
    there is nothing to read: the row absent, or a variance on the way not above 0 (no group's
    rewards differ), where N′ is no measurement."""
    hit = rows[(rows["baseline"] == baseline) & (rows["group_size"] == n)]
    mean = rows.loc[rows["baseline"] == "mean", "variance"]
    if hit.empty or mean.empty or not (mean > 0).all() or not float(hit["variance"].iloc[0]) > 0:
        return
    v, n_prime = float(hit["variance"].iloc[0]), float(hit["equivalent_mean_group_size"].iloc[0])
    color = baseline_color(baseline)
    bottom = ax.get_ylim()[0]
    if math.isinf(n_prime):
        right = ax.get_xlim()[1]
        ax.annotate(
            "", xy=(right, v), xytext=(n, v), arrowprops={"arrowstyle": "->", "color": color}
        )
        ax.text(right, v, f"N′ > {rows['group_size'].max()}", ha="right", va="bottom", fontsize=6)
        return
    below = hit["equivalent_range"].iloc[0] == "below" if "equivalent_range" in hit else False
    ax.plot([n, n_prime], [v, v], color=color, linestyle=":", linewidth=0.9)
    ax.plot([n_prime, n_prime], [v, bottom], color=color, linestyle=":", linewidth=0.9)
    label = f" N′ ≤ {n_prime:.1f}" if below else f" N′≈{n_prime:.1f}"
    ax.text(n_prime, bottom, label, ha="left", va="bottom", fontsize=6)
    ax.set_ylim(bottom=bottom)


def _grouped_bars(ax, rows: pd.DataFrame, by: str, groups: list, value: str) -> None:
    """One bar per baseline inside each group `rows[by] == g` (g in `groups`), log y axis;
    with `<value>_low` and `<value>_high` columns, each bar's 95 % interval as an error bar."""
    labels = list(dict.fromkeys(rows["baseline"]))
    width = 0.8 / len(labels)
    ends = [f"{value}_low", f"{value}_high"]
    for k, label in enumerate(labels):
        values = rows[rows["baseline"] == label].set_index(by).reindex(groups)
        height = values[value].to_numpy(dtype=float)
        interval = None
        if all(c in values for c in ends):
            interval = _bars(height, *(values[c].to_numpy(dtype=float) for c in ends))[:2]
        ax.bar(
            np.arange(len(groups)) + (k - (len(labels) - 1) / 2) * width,
            height,
            width=width,
            color=baseline_color(label),
            hatch=HATCHES.get(variant_of(label), ""),
            edgecolor="white",
            linewidth=0.3,
            label=label,
            yerr=interval,
            error_kw={"elinewidth": 0.7, "capsize": 1.2, "ecolor": "0.2"},
        )
    _log_y(ax, rows[value])
    ax.set_xticks(np.arange(len(groups)), [str(g) for g in groups])
    ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), frameon=False)


def fig_ratio_to_mean(table: pd.DataFrame, aggregation: str = "token-sum") -> Figure:
    """Variance relative to the `mean` baseline at the same N: bars grouped by N (log scale; the
    line at 1 is the mean baseline itself, below it is better), each with its 95 % interval
    where the table has one (`ratio_to_mean_low`, `_high`: what `variance-compare`'s verdicts
    read, `pipelines/variance/evidence.py:mode_intervals`).

    `table`: columns aggregation, baseline, group_size, ratio_to_mean, and `mode` (named in
    the title) where it has it."""
    rows = _rows(table, aggregation)
    rows = rows[rows["baseline"] != "mean"]
    sizes = sorted(rows["group_size"].unique())
    fig, ax = new_figure(width_in=max(3.4, 0.9 * len(sizes) + 1.0))
    with mpl.rc_context(STYLE):
        _grouped_bars(ax, rows, "group_size", sizes, "ratio_to_mean")
        ax.axhline(1.0, color="0.3", linewidth=0.8)
        ax.set_xlabel("group size N (responses per prompt)")
        ax.set_ylabel("variance / variance of mean baseline")
        ax.set_title(f"Variance relative to the group mean ({_setting(rows, aggregation)})")
    return fig


def fig_variance_by_block(
    blocks: pd.DataFrame, aggregation: str = "token-sum", group_size: int = 4
) -> Figure:
    """Where the gradient variance lives: tr Cov(ĝ_b) per parameter block b (embeddings, layers,
    final norm, head), one bar per baseline, at N = `group_size` (or the largest N below it).

    `blocks`: variance_blocks.csv (columns block, aggregation, baseline, group_size, variance)."""
    rows = _rows(blocks, aggregation)
    sizes = sorted(rows["group_size"].unique())
    n = max([s for s in sizes if s <= group_size] or sizes[:1])
    rows = rows[rows["group_size"] == n]
    names = list(dict.fromkeys(rows["block"]))
    fig, ax = new_figure(width_in=max(3.4, 0.5 * len(names) + 1.5), height_in=2.8)
    with mpl.rc_context(STYLE):
        _grouped_bars(ax, rows, "block", names, "variance")
        ax.tick_params(axis="x", labelrotation=45)
        ax.set_xlabel("parameter block")
        ax.set_ylabel(r"variance tr Cov($\hat g_b$)")
        ax.set_title(f"Gradient variance per block, N = {n} ({aggregation})")
    return fig


def fig_proxy_fidelity(tokens: pd.DataFrame) -> Figure:
    """Proxy `w_t` against the true per-token `‖∇ log p_t‖²` over generated tokens (hexbin,
    log–log, log colour), Spearman ρ over all of them in the title. Tokens with a zero value on
    either axis cannot sit on a log axis: they count in ρ but are not drawn.

    `tokens`: columns w, true_sq_norm and (optionally) mask."""
    toks = tokens[tokens["mask"] > 0] if "mask" in tokens else tokens
    rho = correlations(toks["w"], toks["true_sq_norm"])["spearman"]
    shown = toks[(toks["w"] > 0) & (toks["true_sq_norm"] > 0)]
    fig, ax = new_figure(height_in=2.7)
    with mpl.rc_context(STYLE):
        hb = ax.hexbin(
            shown["w"],
            shown["true_sq_norm"],
            xscale="log",
            yscale="log",
            gridsize=40,
            bins="log",
            cmap="viridis",
            mincnt=1,
        )
        fig.colorbar(hb, ax=ax, label="tokens (log scale)")
        ax.set_xlabel(r"proxy $w_t=\|\partial \log p_t/\partial z_t\|^2$")
        ax.set_ylabel(r"true $\|\nabla_\theta \log p_t\|^2$")
        ax.set_title(f"Proxy fidelity: Spearman ρ = {rho:.3f} ({len(toks):,} tokens)")
    return fig


def fig_knee_tokens(table: pd.DataFrame, aggregation: str = "token-sum") -> Figure:
    """Tokens per step at the knee, `B·N·L̄`, against group size N (log–log), one line per
    baseline, each baseline's points shifted a little about N (`style.dodged`: equal knees stay
    visible). Where `|G|²` is resolved from 0: a filled point with its 95 % interval (an
    interval open above ends at the top of the axes). Elsewhere no knee is claimed, only a
    lower bound: a hollow ▲ at the interval's low end ("at least this many tokens").

    `table`: columns of `maths/noise/knee.py:noise_table` (aggregation, baseline,
    group_size, noise_scale_tokens with _low and _high, grad_sq_resolved)."""
    rows = _rows(table, aggregation)
    sizes = sorted(rows["group_size"].unique())
    labels = list(dict.fromkeys(rows["baseline"]))
    fig, ax = new_figure(height_in=2.8)
    undrawn = False  # a resolved point whose interval could not be drawn around it
    with mpl.rc_context(STYLE):
        top = _axis_top(rows)
        for k, (label, curve) in enumerate(rows.groupby("baseline", sort=False)):
            curve = curve.sort_values("group_size")
            color = baseline_color(label)
            style = LINESTYLES.get(variant_of(label), "-." if variant_of(label) else "-")
            resolved = curve[curve["grad_sq_resolved"].astype(bool)]
            bound = curve[~curve["grad_sq_resolved"].astype(bool)]
            y = resolved["noise_scale_tokens"].to_numpy(dtype=float)
            ends = (
                resolved[f"noise_scale_tokens_{e}"].to_numpy(dtype=float) for e in ("low", "high")
            )
            below, above, drawn = _bars(y, *ends, top=top)
            undrawn |= not drawn.all()
            ax.errorbar(
                dodged(resolved["group_size"], k, len(labels)), y, yerr=[below, above],
                color=color, linestyle=style, marker="o", markersize=2.5, capsize=1.5,
                label=label if len(resolved) else None,
            )  # fmt: skip
            ax.plot(
                dodged(bound["group_size"], k, len(labels)), bound["noise_scale_tokens_low"],
                linestyle=":", linewidth=0.8, marker="^", markersize=3.5,
                markerfacecolor="none", color=color,
                label=f"{label} (≥)" if len(bound) else None,
            )  # fmt: skip
        ax.set_xscale("log", base=2)
        _log_y(ax, pd.concat([rows["noise_scale_tokens"], rows["noise_scale_tokens_low"]]))
        ax.set_xticks(sizes, [str(n) for n in sizes])
        ax.minorticks_off()
        ax.set_xlabel("group size N (responses per prompt)")
        ax.set_ylabel(r"tokens per step at the knee $B\,N\,\bar L$")
        ax.set_title(f"Cost of a step at the noise scale ({_setting(rows, aggregation)})")
        notes = []
        if not rows["grad_sq_resolved"].astype(bool).all():
            notes.append("(≥): |G|² not resolved,\nknee at least there")
        if undrawn:
            notes.append("a point without bars: its\ninterval is undefined (NaN)\nor misses it")
        ax.legend(
            loc="upper left", bbox_to_anchor=(1.0, 1.0), frameon=False,
            title="\n".join(notes) or None, title_fontsize=6,
        )  # fmt: skip
    return fig


def _axis_top(rows: pd.DataFrame) -> float:
    """Where an interval open above ends: twice the largest finite interval end (1 when none;
    `_bars` keeps it above the point)."""
    ends = rows[["noise_scale_tokens_low", "noise_scale_tokens_high"]].to_numpy(dtype=float)
    finite = ends[np.isfinite(ends)]
    return float(finite.max()) * 2 if finite.size else 1.0
