"""Every figure draws the numbers of the tables its command wrote: the plots/ functions are run
on the tables of a real energy and variance-compare run (the session fixture `runs`) and of a
dynamics table, and their axes, series and labels are compared with those tables (the pipeline
tests only check that the files are saved)."""

import json
import math
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.colors import to_hex
from matplotlib.container import BarContainer

from otb_diag.integrations.core.metric_levels import HEADLINE
from otb_diag.pipelines.variance.evidence import mode_intervals
from otb_diag.plots import dynamics as plots_dynamics
from otb_diag.plots import energy as plots_energy
from otb_diag.plots import variance as plots_variance
from otb_diag.plots.style import FAIL_COLOR, PASS_COLOR, baseline_color, dodged, save_figure


def legend_labels(ax) -> list[str]:
    return [t.get_text() for t in ax.get_legend().get_texts()]


def drawn_lines(ax) -> list:
    """The lines of `ax` that hold data (a figure adds empty ones: no lone point to mark)."""
    return [x for x in ax.get_lines() if len(x.get_xdata())]


def visible_points(ax) -> set[tuple[float, float]]:
    """Every (x, y) a reader sees on `ax`'s lines: all finite points of a line with a marker,
    and on a line without one, the finite points with a finite neighbour (a segment reaches
    them); a point with neither is not seen."""
    seen = set()
    for line in ax.get_lines():
        x = np.asarray(line.get_xdata(), dtype=float)
        y = np.asarray(line.get_ydata(), dtype=float)
        finite = np.isfinite(x) & np.isfinite(y)
        if line.get_marker() in ("None", "", " ", None):
            if line.get_linestyle() in ("None", "", " "):
                continue
            finite &= np.r_[False, finite[:-1]] | np.r_[finite[1:], False]
        seen |= {(float(a), float(b)) for a, b in zip(x[finite], y[finite], strict=True)}
    return seen


def unseen(points: pd.DataFrame, x: str, y: str, ax) -> list[tuple[float, float]]:
    """The rows of `points` (columns `x`, `y`, finite values) that `ax` does not show."""
    seen = visible_points(ax)
    rows = points[np.isfinite(points[x]) & np.isfinite(points[y])]
    return [
        (a, b) for a, b in zip(rows[x], rows[y], strict=True) if (float(a), float(b)) not in seen
    ]


def bar_heights(ax) -> np.ndarray:
    return np.array([p.get_height() for p in ax.patches])


# --- energy: fig3, fig4, fig5, energy by step -------------------------------------------------


@pytest.fixture(scope="module")
def energy(runs: Path) -> tuple[pd.DataFrame, pd.DataFrame, str]:
    out = runs / "energy"
    group = json.loads((out / "summary.json").read_text())["figure_group"]
    return pd.read_csv(out / "sequences.csv"), pd.read_parquet(out / "tokens.parquet"), group


def test_fig3_bars_are_the_groups_sequence_energies_coloured_by_reward(energy) -> None:
    sequences, _, group = energy
    ax = plots_energy.fig3_sequence_energy(sequences, group).axes[0]
    rows = sequences[sequences["group"] == group].sort_values("sample")
    np.testing.assert_allclose(bar_heights(ax), rows["energy"])
    assert [p.get_x() + p.get_width() / 2 for p in ax.patches] == pytest.approx(rows["sample"])
    colours = [to_hex(p.get_facecolor()) for p in ax.patches]
    expected = [to_hex(PASS_COLOR if r > 0 else FAIL_COLOR) for r in rows["reward"]]
    assert colours == expected and len(set(colours)) == 2  # the figure's group is mixed
    assert ax.get_title() == f"Sequence energy within group {group}"
    assert "W(\\tau)" in ax.get_ylabel() and "sample index" in ax.get_xlabel()
    assert legend_labels(ax) == ["reward > 0", "reward ≤ 0"]


def test_fig4_lines_are_the_cumulative_energy_of_the_shown_samples(energy) -> None:
    sequences, tokens, group = energy
    shown = plots_energy.spread_samples(sequences, group, count=8)
    ax = plots_energy.fig4_cumulative_energy(tokens, shown, group).axes[0]
    labels = legend_labels(ax)
    assert len(labels) >= 2
    curves = [line for line in ax.get_lines() if line.get_label() in labels]
    for line, label in zip(curves, labels, strict=True):
        first = int(label.removeprefix("seq ").split(" = ")[0])
        rows = tokens[(tokens["group"] == group) & (tokens["sample"] == first)].sort_values("t")
        np.testing.assert_allclose(line.get_xdata(), rows["t"])
        np.testing.assert_allclose(line.get_ydata(), rows["W"])
        final = sequences[(sequences["group"] == group) & (sequences["sample"] == first)]
        assert line.get_ydata()[-1] == pytest.approx(float(final["energy"].iloc[0]), rel=1e-5)
    shown_in_legend = {int(s) for label in labels for s in label[4:].split(" = ")}
    assert shown_in_legend == set(shown)


def test_fig5_counts_every_generated_token_under_the_envelope(energy) -> None:
    _, tokens, _ = energy
    fig = plots_energy.fig5_probability_vs_gradient(tokens, vocab_size=None)
    ax = fig.axes[0]
    generated = int((tokens["mask"] > 0).sum())
    assert ax.get_title() == f"Confidence vs. logit-gradient norm ({generated:,} tokens)"
    (hexbin,) = ax.collections
    assert hexbin.get_array().sum() == generated  # every token within the extent, once
    upper, lower = ax.get_lines()
    p = upper.get_xdata()
    np.testing.assert_allclose(upper.get_ydata(), 2 * (1 - p) ** 2)
    np.testing.assert_allclose(lower.get_ydata(), (1 - p) ** 2)  # V unknown: V/(V-1) -> 1
    assert legend_labels(ax) == [r"$2(1-p)^2$", r"$(1-p)^2\,V/(V-1)$"]


def test_energy_by_step_boxes_hold_each_steps_energies(energy) -> None:
    sequences, _, _ = energy
    by_step = sequences.assign(step=np.where(sequences["sample"] % 2 == 0, 10, 20))
    ax = plots_energy.fig_energy_by_step(by_step).axes[0]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["10", "20"]
    # per box: 2 whiskers, 2 caps, the box, the median, the fliers
    medians = [float(line.get_ydata()[0]) for line in ax.get_lines()[5::7]]
    expected = by_step.groupby("step")["energy"].median().to_list()
    assert medians == pytest.approx(expected)
    assert ax.get_yscale() == "log" and ax.get_xlabel() == "training step of the checkpoint"


# --- variance-compare: variance against N, ratio to mean -------------------------------------


@pytest.fixture(scope="module")
def variance(runs: Path) -> pd.DataFrame:
    return pd.read_csv(runs / "variance" / "variance.csv")


SKETCH_DIM = 32  # the `runs` fixture's --sketch-dim (tests/small_runs.py)


def verdict_rows(variance: pd.DataFrame, mode: str, aggregation: str) -> pd.DataFrame:
    """One mode's rows of one aggregation with the intervals its verdicts read, as
    `variance-compare` hands them to its figures (`evidence.mode_intervals`)."""
    rows = variance[(variance["mode"] == mode) & (variance["aggregation"] == aggregation)]
    return mode_intervals(rows, mode, SKETCH_DIM)


def bar_ends(container) -> np.ndarray:
    """An errorbar container's vertical bars as `[n, 2]` (low, high) ends, in drawing order."""
    (bars,) = container.lines[2]
    return np.array([[seg[0, 1], seg[1, 1]] for seg in bars.get_segments()])


@pytest.mark.parametrize("mode", ["proxy", "full"])
def test_variance_vs_n_draws_each_baselines_variance_and_interval(variance, mode) -> None:
    """Each baseline's variance at each N (its points a little apart about N, in the
    baselines' order) with the interval the verdicts read as its bars; the title names the
    mode."""
    rows = verdict_rows(variance, mode, "token-sum")
    ax = plots_variance.fig_variance_vs_group_size(rows).axes[0]
    baselines = list(dict.fromkeys(rows["baseline"]))
    assert legend_labels(ax) == baselines
    containers = {c.get_label(): c for c in ax.containers}
    previous = None
    for baseline in baselines:
        curve = rows[rows["baseline"] == baseline].sort_values("group_size")
        line = containers[baseline].lines[0]
        x = np.asarray(line.get_xdata(), dtype=float)
        np.testing.assert_allclose(np.log2(x), np.log2(curve["group_size"]), atol=0.2)
        assert previous is None or (x > previous).all()  # apart, in order
        previous = x
        np.testing.assert_allclose(line.get_ydata(), curve["variance"])
        np.testing.assert_allclose(bar_ends(containers[baseline]), curve[["ci_low", "ci_high"]])
        assert to_hex(line.get_color()) == to_hex(baseline_color(baseline))
    assert ax.get_xscale() == "log" and ax.get_yscale() == "log"
    assert [t.get_text() for t in ax.get_xticklabels()] == ["2", "4"]
    assert ax.get_title() == f"Gradient variance vs. group size ({mode} mode, token-sum)"
    assert ax.get_xlabel() == "group size N (responses per prompt)"


def test_head_modes_figures_draw_the_intervals_of_their_verdict(variance) -> None:
    """The intervals the verdicts read are wider than the bootstrap over draws alone (the
    seeded projection of the scores, issue 53: head mode's bands drew 0.339 surer than its
    "[0.0395, 2.9], not resolved"): the variance figure draws those, and the ratio figure
    each bar's interval, OTB's at N = 4 that of the verdict's table."""
    rows = verdict_rows(variance, "full", "token-sum")
    draws_only = variance[(variance["mode"] == "full") & (variance["aggregation"] == "token-sum")]
    assert (rows["ci_high"] - rows["ci_low"] > draws_only["ci_high"] - draws_only["ci_low"]).all()
    ax = plots_variance.fig_ratio_to_mean(rows).axes[0]
    bars = rows[rows["baseline"] != "mean"]
    baselines = list(dict.fromkeys(bars["baseline"]))
    expected = pd.concat([bars[bars["baseline"] == b].sort_values("group_size") for b in baselines])
    bar_groups = [c for c in ax.containers if isinstance(c, BarContainer)]
    assert all(c.errorbar is not None for c in bar_groups)  # every bar carries its interval
    drawn = np.concatenate([bar_ends(c.errorbar) for c in bar_groups])
    np.testing.assert_allclose(drawn, expected[["ratio_to_mean_low", "ratio_to_mean_high"]])
    assert ax.get_title() == "Variance relative to the group mean (full mode, token-sum)"


def test_ratio_to_mean_bars_are_the_tables_ratios(variance) -> None:
    table = variance[variance["mode"] == "full"]
    ax = plots_variance.fig_ratio_to_mean(table, "seq-mean-token-mean").axes[0]
    rows = table[(table["aggregation"] == "seq-mean-token-mean") & (table["baseline"] != "mean")]
    baselines = list(dict.fromkeys(rows["baseline"]))
    assert legend_labels(ax) == baselines  # the mean baseline is the line at 1, not a bar
    expected = np.concatenate(
        [rows[rows["baseline"] == b].sort_values("group_size")["ratio_to_mean"] for b in baselines]
    )
    np.testing.assert_allclose(bar_heights(ax), expected)
    assert ax.get_title() == "Variance relative to the group mean (full mode, seq-mean-token-mean)"
    assert [line.get_ydata()[0] for line in ax.get_lines()] == [1.0]


def test_knee_tokens_draws_resolved_points_and_lower_bounds() -> None:
    """A planted table: resolved rows are points at B·N·L̄ with their interval, unresolved rows
    hollow triangles at the interval's low end, legend and labels say which."""
    rows = []
    for baseline, resolved in (("mean", True), ("otb", False)):
        for n, tokens in ((2, 800.0), (4, 600.0)):
            rows.append({
                "aggregation": "token-sum", "baseline": baseline, "group_size": n,
                "noise_scale_tokens": tokens, "noise_scale_tokens_low": tokens / 2,
                "noise_scale_tokens_high": tokens * 2, "grad_sq_resolved": resolved,
            })  # fmt: skip
    table = pd.DataFrame(rows)
    ax = plots_variance.fig_knee_tokens(table).axes[0]
    assert sorted(legend_labels(ax)) == ["mean", "otb (≥)"]
    lines = {line.get_label(): line for line in ax.get_lines()}
    (points,) = [c.lines[0] for c in ax.containers if c.get_label() == "mean"]  # errorbar
    np.testing.assert_allclose(points.get_ydata(), [800.0, 600.0])
    np.testing.assert_allclose(lines["otb (≥)"].get_ydata(), [400.0, 300.0])  # lower bounds
    assert lines["otb (≥)"].get_marker() == "^" and lines["otb (≥)"].get_markerfacecolor() == "none"
    assert to_hex(points.get_color()) == to_hex(baseline_color("mean"))
    segments = [s for c in ax.collections for s in c.get_segments()]  # the error bars
    assert any(np.allclose(seg[:, 1], [400.0, 1600.0]) for seg in segments)
    assert "knee" in ax.get_ylabel() and "group size N" in ax.get_xlabel()
    assert "not resolved" in ax.get_legend().get_title().get_text()


def test_unknown_aggregation_is_named(variance) -> None:
    with pytest.raises(ValueError, match="no rows for aggregation 'token-max'"):
        plots_variance.fig_ratio_to_mean(variance, "token-max")


# --- dynamics: fig1, fig2, score against tokens ------------------------------------------------


def dynamics_table() -> tuple[pd.DataFrame, list[SimpleNamespace]]:
    """Two runs as dynamics.csv holds them; the first collapses at step 30, warned at 22."""
    rng = np.random.default_rng(0)
    frames = []
    for run, baseline, n in [("otb N=4", "otb", 4), ("mean N=16", "mean", 16)]:
        steps = np.arange(1, 41)
        grad = np.exp(rng.normal(0, 0.1, 40)) * np.where(steps >= 30, 20.0, 1.0)
        score = np.clip(steps / 50 + rng.normal(0, 0.02, 40), 0, 1)
        frames.append(
            pd.DataFrame(
                {
                    "run": run,
                    "step": steps,
                    "grad_norm": grad if run == "otb N=4" else grad[::-1].copy() / 20,
                    "score": score,
                    "score_smoothed": pd.Series(score).rolling(5).mean(),
                    "variance_proxy": grad**2,
                    "tokens_sampled": np.cumsum(np.full(40, 100.0 * n)),
                    "baseline": baseline,
                    "group_size": n,
                }
            )
        )
    runs = [
        SimpleNamespace(run="otb N=4", collapse_step=30, warning_step=22, tokens_to_target=5000.0,
                        variance_proxy_kind="proxy2_total_power"),
        SimpleNamespace(run="mean N=16", collapse_step=None, warning_step=None,
                        tokens_to_target=None, variance_proxy_kind="proxy2_total_power"),
    ]  # fmt: skip
    return pd.concat(frames, ignore_index=True), runs


def test_fig1_draws_grad_norm_and_smoothed_score_with_the_collapse() -> None:
    table, runs = dynamics_table()
    top, bottom = plots_dynamics.fig1_grad_norm_and_score(table, runs).axes
    assert legend_labels(top) == ["otb N=4", "mean N=16"]
    for run, rows in table.groupby("run", sort=False):
        (line,) = [x for x in top.get_lines() if x.get_label() == run]
        np.testing.assert_allclose(line.get_xdata(), rows["step"])
        np.testing.assert_allclose(line.get_ydata(), rows["grad_norm"])
        smoothed = [
            x for x in bottom.get_lines() if len(x.get_xdata()) == 40 and x.get_alpha() is None
        ]
        assert any(
            np.allclose(x.get_ydata(), rows["score_smoothed"], equal_nan=True) for x in smoothed
        )
    collapse = [x for x in top.get_lines() if x.get_linestyle() == ":"]
    assert [x.get_xdata()[0] for x in collapse] == [30]  # one collapse, otb's
    assert top.get_yscale() == "log" and bottom.get_xlabel() == "training step"
    assert top.get_ylabel() == "gradient norm ‖g‖" and bottom.get_ylabel() == "score (mean reward)"


def test_fig2_draws_the_variance_proxy_warning_and_collapse() -> None:
    table, runs = dynamics_table()
    top, _ = plots_dynamics.fig2_variance_and_grad_norm(table, runs).axes
    for run, rows in table.groupby("run", sort=False):
        (line,) = [x for x in top.get_lines() if x.get_label() == run]
        np.testing.assert_allclose(line.get_ydata(), rows["variance_proxy"])
    marks = {
        (x.get_linestyle(), x.get_xdata()[0])
        for x in top.get_lines()
        if len(x.get_xdata()) == 2 and x.get_xdata()[0] == x.get_xdata()[1]
    }
    assert marks == {("--", 22), (":", 30)}
    assert "proxy: proxy2_total_power" in top.get_title()


def test_score_vs_tokens_draws_each_run_and_the_target() -> None:
    table, runs = dynamics_table()
    ax = plots_dynamics.fig_score_vs_tokens(table, runs, target=0.5).axes[0]
    assert legend_labels(ax) == ["otb, N=4", "mean, N=16"]
    for label, (_, rows) in zip(legend_labels(ax), table.groupby("run", sort=False), strict=True):
        (line,) = [x for x in ax.get_lines() if x.get_label() == label]
        np.testing.assert_allclose(line.get_xdata(), rows["tokens_sampled"])
        np.testing.assert_allclose(line.get_ydata(), rows["score"])
    reached = [x for x in drawn_lines(ax) if x.get_marker() == "o"]
    assert [(x.get_xdata()[0], x.get_ydata()[0]) for x in reached] == [(5000.0, 0.5)]
    assert ax.get_title() == "Score against tokens sampled (target 0.5)"


def test_eleven_seeds_of_one_identity_draw_eleven_different_lines() -> None:
    """Runs sharing baseline and N (seeds) get a colour each, then the next line style past the
    palette's 8 colours: no two of 11 lines look alike (issue 42's SmolLM2 comparison)."""
    table, runs = dynamics_table()
    one = table[table["run"] == "otb N=4"]
    seeds = pd.concat([one.assign(run=f"otb N=4#{k}") for k in range(11)], ignore_index=True)
    marks = [SimpleNamespace(**{**vars(runs[0]), "run": f"otb N=4#{k}"}) for k in range(11)]
    ax = plots_dynamics.fig_score_vs_tokens(seeds, marks, target=None).axes[0]
    looks = {(to_hex(x.get_color()), x.get_linestyle()) for x in drawn_lines(ax)}
    assert len(looks) == 11


def pooled_rows(run: str, steps: list[int], resolved: list[bool], b: list[float],
                low: list[float], high: list[float]) -> pd.DataFrame:  # fmt: skip
    """A budget.csv's window rows of one estimator (grpo) of `run`, at P = 8."""
    return pd.DataFrame({
        "run": run, "step": steps, "estimator": "grpo", "pool": "window",
        "effective_steps": np.arange(1, len(steps) + 1, dtype=float),
        "resolved": np.array(resolved, dtype=float), "noise_scale": b,
        "noise_scale_low": low, "noise_scale_high": high, "prompts_per_step": 8.0,
    })  # fmt: skip


def logged_steps(budget: pd.DataFrame, **columns: list[float]) -> pd.DataFrame:
    """dynamics.csv's rows of `budget`'s runs at its steps: P = 8 prompts a step
    (`otb/split/prompts`) and any other `columns` (one value a step)."""
    rows = budget[["run", "step"]].drop_duplicates().reset_index(drop=True)
    return rows.assign(**{"otb/split/prompts": 8.0}, **columns)


def test_pooled_noise_scale_draws_knees_where_resolved_and_bounds_where_not() -> None:
    """Step 1 (|G|² = 1e-13: B = 1e13, no interval) draws nothing and sets no limit; step 2,
    unresolved, a hollow dot at its lower bound; steps 3-4, resolved, filled dots at B on the
    line. The legend gives the estimator as its band's colour and says what the band and the
    filled and hollow dots are; a panel with bounds alone lists no knee (no line promised)."""
    inf = math.inf
    rows = pooled_rows("a", [1, 2, 3, 4], [False, False, True, True], [1e13, 500.0, 40.0, 45.0],
                       [-inf, 20.0, 25.0, 30.0], [inf, inf, 90.0, 80.0])  # fmt: skip
    ax = plots_dynamics.fig_pooled_noise_scale(rows, logged_steps(rows)).axes[0]
    lines = drawn_lines(ax)
    assert max(np.nanmax(np.asarray(x.get_ydata(), dtype=float)) for x in lines) < 1e3
    assert ax.get_ylim()[1] < 1e3
    grpo = to_hex(baseline_color("grpo"))
    (line,) = [x for x in lines if x.get_linestyle() == "-" and to_hex(x.get_color()) == grpo
               and x.get_marker() == "None"]  # fmt: skip
    np.testing.assert_allclose(line.get_ydata(), [np.nan, np.nan, 40.0, 45.0])
    (filled,) = [x for x in lines if x.get_marker() == "o" and x.get_markerfacecolor() != "white"]
    (hollow,) = [x for x in lines if x.get_marker() == "o" and x.get_markerfacecolor() == "white"]
    np.testing.assert_allclose(filled.get_xydata(), [[3, 40.0], [4, 45.0]])
    np.testing.assert_allclose(hollow.get_xydata(), [[2, 20.0]])
    (first,) = [x for x in lines if x.get_marker() == "|"]  # one split step: no interval
    assert first.get_xdata().tolist() == [1.0]
    assert legend_labels(ax) == [
        "grpo: B's 95 % interval", "P, the run's prompts a step = 8", "knee B (|G|² resolved)",
        "knee ≥ this (|G|² not resolved)", "one split step: no interval yet",
    ]  # fmt: skip
    (swatch,) = [h for h in ax.get_legend().legend_handles if h.get_label().startswith("grpo")]
    (band,) = ax.collections  # fill_between: the band
    assert to_hex(swatch.get_facecolor(), keep_alpha=True) == to_hex(
        band.get_facecolor()[0], keep_alpha=True
    )  # the legend's swatch is the band's colour (it was grey)
    bounds = rows.assign(resolved=0.0)
    ax = plots_dynamics.fig_pooled_noise_scale(bounds, logged_steps(bounds)).axes[0]
    assert "knee B (|G|² resolved)" not in legend_labels(ax)
    assert legend_labels(ax)[-2] == "knee ≥ this (|G|² not resolved)"


def test_pooled_noise_scale_marks_a_step_with_no_signal_and_the_prompts_of_each_update() -> None:
    """A step whose |G|² is ≤ 0 over its whole interval (B's low end infinite: no knee, no
    bound) is a hollow ▲ at the top, where it left a gap; under the knee controller the prompts
    of each step's update, as applied, are a line at every step, beside P a step (issue 53:
    the figure drew "the run's P = 2" alone, its updates taking 16)."""
    inf = math.inf
    rows = pooled_rows("knee", [1, 2, 3, 4, 5], [False] * 5, [inf] * 5,
                       [0.0, 20.0, 30.0, inf, 25.0], [inf] * 5)  # fmt: skip
    applied = [2.0, 2.0, 4.0, 4.0, 16.0]
    steps = logged_steps(rows, **{"otb/controller/prompts_per_update": applied})
    steps["otb/split/prompts"] = 2.0
    ax = plots_dynamics.fig_pooled_noise_scale(rows, steps).axes[0]
    lines = drawn_lines(ax)
    (top,) = [x for x in lines if x.get_marker() == "^"]
    assert top.get_xdata().tolist() == [4.0]
    assert top.get_ydata()[0] == pytest.approx(ax.get_ylim()[1])
    (update,) = [x for x in lines if x.get_drawstyle() == "steps-mid" and x.get_linestyle() == "-"]
    np.testing.assert_array_equal(update.get_xydata(), np.c_[[1, 2, 3, 4, 5], applied])
    (sampled,) = [
        x for x in lines if x.get_drawstyle() == "steps-mid" and x.get_linestyle() == "--"
    ]
    assert set(sampled.get_ydata()) == {2.0}
    labels = legend_labels(ax)
    assert "P, prompts a step sampled = 2" in labels
    assert "prompts an update took\n(knee controller, as applied)" in labels
    assert "no signal measurable\n(|G|² ≤ 0 over its interval)" in labels
    assert ax.get_ylim()[0] < 2.0 < 16.0 < ax.get_ylim()[1]  # the prompts within the axes


def shown_ticks(ax) -> list[float]:
    """The x ticks inside the axis' limits (the locator also returns some just outside)."""
    low, high = ax.get_xlim()
    return [float(t) for t in ax.get_xticks() if low <= t <= high]


def test_the_step_axes_tick_whole_steps() -> None:
    """A run of 2 steps ticked 1.2, 1.4, …; a one-split-step run's pooled panel too."""
    table, runs = dynamics_table()
    two = table[table["step"] <= 2]
    calm = [SimpleNamespace(**{**vars(r), "collapse_step": None, "warning_step": None})
            for r in runs]  # fmt: skip
    for fig in (plots_dynamics.fig1_grad_norm_and_score(two, calm),
                plots_dynamics.fig2_variance_and_grad_norm(two, calm)):  # fmt: skip
        assert shown_ticks(fig.axes[-1]) == [1.0, 2.0]
    one = pooled_rows("one", [5], [False], [12.0], [-math.inf], [math.inf])
    ax = plots_dynamics.fig_pooled_noise_scale(one, logged_steps(one)).axes[0]
    assert shown_ticks(ax) == [5.0]
    assert "no knee and no bound yet" in " ".join(t.get_text() for t in ax.texts)


@pytest.mark.renders  # reads the rendered figures
def test_a_pooled_panels_step_ticks_clear_the_next_title() -> None:
    """Two runs, the first of one split step: its tick labels end above the next panel's title."""
    inf = math.inf
    budget = pd.concat([pooled_rows("one", [1], [False], [9.0], [-inf], [inf]),
                        pooled_rows("two", [1, 2], [False, True], [9.0, 9.0], [-inf, 5.0],
                                    [inf, 20.0])])  # fmt: skip
    fig = plots_dynamics.fig_pooled_noise_scale(budget, logged_steps(budget))
    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    renderer = canvas.get_renderer()
    first, second = fig.axes
    ticks = [t.get_window_extent(renderer) for t in first.get_xticklabels() if t.get_text()]
    title = second.title.get_window_extent(renderer)
    assert ticks and min(t.y0 for t in ticks) > title.y1


@pytest.mark.renders  # reads the rendered figures
def test_save_figure_writes_png_and_pdf(tmp_path: Path) -> None:
    table, runs = dynamics_table()
    fig = plots_dynamics.fig1_grad_norm_and_score(table, runs)
    paths = save_figure(fig, tmp_path, "fig1")
    assert sorted(p.name for p in paths) == ["fig1.pdf", "fig1.png"]
    assert (tmp_path / "fig1.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (tmp_path / "fig1.pdf").read_bytes()[:5] == b"%PDF-"


BOUNDS = st.one_of(
    st.floats(min_value=-1e12, max_value=1e12, allow_nan=False),
    st.sampled_from([math.inf, -math.inf, math.nan, 0.0]),
)


@pytest.mark.filterwarnings("ignore:Data has no positive values")  # all-NaN tables: no log axis
@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(st.booleans(), BOUNDS, BOUNDS, BOUNDS, st.sampled_from([2, 4, 8])),
        min_size=1, max_size=8,
    )
)  # fmt: skip
@pytest.mark.slow  # renders whole figures to PNG and PDF (seconds)
def test_figures_with_intervals_draw_any_bounds(rows) -> None:
    """A figure never fails a command: the knee figure, the variance figure and the ratio
    figure draw arbitrary finite, infinite and NaN points and bounds (matplotlib refuses a
    negative error bar), and every bar drawn contains its point."""
    table = pd.DataFrame(
        [
            {
                "aggregation": "token-sum", "baseline": ("mean", "otb")[i % 2],
                "group_size": n, "grad_sq_resolved": resolved,
                "noise_scale_tokens": y, "noise_scale_tokens_low": low,
                "noise_scale_tokens_high": high,
                "variance": y, "ci_low": low, "ci_high": high,
                "equivalent_mean_group_size": high,
                "ratio_to_mean": y, "ratio_to_mean_low": low, "ratio_to_mean_high": high,
            }
            for i, (resolved, y, low, high, n) in enumerate(rows)
        ]
    )  # fmt: skip
    with np.errstate(all="ignore"):  # numpy's own warnings on inf − inf
        knee = plots_variance.fig_knee_tokens(table)
        spread = plots_variance.fig_variance_vs_group_size(table, mark=("otb", 4))
        one_a_bar = table.drop_duplicates("group_size")  # one bar a group
        ratio = plots_variance.fig_ratio_to_mean(one_a_bar.assign(baseline="otb"))
    for fig in (knee, spread, ratio):
        fig.canvas.draw()
        for container in fig.axes[0].containers:  # errorbar: (line, caps, bars)
            if isinstance(container, BarContainer):  # bars: their heights, their errorbar's
                points = [patch.get_height() for patch in container.patches]
                (bars,) = container.errorbar.lines[2]
            elif container.lines[0] is None:  # a bar chart's errorbar, read with its bars
                continue
            else:
                points = container.lines[0].get_ydata()
                (bars,) = container.lines[2]
            for seg, point in zip(bars.get_segments(), points, strict=True):
                if np.isfinite(point):
                    assert seg[0, 1] <= point <= seg[1, 1]


@pytest.mark.parametrize("span", [1e0, 1e8])
def test_log_axes_keep_labelled_ticks_over_any_range(span) -> None:
    """Within a decade ticks are plain 1-2-5 values; over many decades matplotlib's 10^n ticks
    stay (a 1-2-5 locator thins to no labelled tick at all there)."""
    table = pd.DataFrame(
        {
            "aggregation": "token-sum", "baseline": "mean", "group_size": [2, 4],
            "noise_scale_tokens": [10.0, 10.0 * span], "grad_sq_resolved": True,
            "noise_scale_tokens_low": [5.0, 5.0 * span],
            "noise_scale_tokens_high": [20.0, 20.0 * span],
        }
    )  # fmt: skip
    fig = plots_variance.fig_knee_tokens(table)
    fig.canvas.draw()
    low, high = fig.axes[0].get_ylim()
    labels = [
        t.get_text() for t in fig.axes[0].get_yticklabels() if low <= t.get_position()[1] <= high
    ]
    assert len([t for t in labels if t]) >= 2, labels


def test_all_zero_variances_draw_on_a_linear_axis_with_a_note() -> None:
    """Pools whose rewards never differ give every baseline a variance of 0 and an infinite knee
    (SmolLM2 sampled on 2 prompts did): the figures draw a linear axis and say why, where a log
    axis of zeros or infinities made matplotlib raise and the command exit 3."""
    table = pd.DataFrame(
        {
            "aggregation": "token-sum", "baseline": ["mean", "otb", "mean", "otb"],
            "group_size": [2, 2, 4, 4], "variance": 0.0, "ci_low": 0.0, "ci_high": 0.0,
            "equivalent_mean_group_size": math.nan, "ratio_to_mean": math.nan,
            "noise_scale_tokens": math.inf, "noise_scale_tokens_low": math.inf,
            "noise_scale_tokens_high": math.inf, "grad_sq_resolved": False,
        }
    )  # fmt: skip
    blocks = table.assign(block="head")
    for fig in (
        plots_variance.fig_variance_vs_group_size(table),
        plots_variance.fig_ratio_to_mean(table),
        plots_variance.fig_variance_by_block(blocks),
        plots_variance.fig_knee_tokens(table),
    ):
        fig.canvas.draw()
        ax = fig.axes[0]
        assert ax.get_yscale() == "linear"
        assert any("every value is 0, infinite" in t.get_text() for t in ax.texts)
    positive = plots_variance.fig_variance_vs_group_size(
        table.assign(variance=[1.0, 0.5, 0.5, 0.2])
    )
    assert positive.axes[0].get_yscale() == "log"


def test_all_zero_variances_draw_no_read_off() -> None:
    """The all-zero pools of the test above: no dotted N′ line and no "N′≈" label (an N′ read
    off a curve of zeros is no measurement); where the mean curve is already lower at the
    smallest N, the label says N′ is at most that N."""
    table = pd.DataFrame(
        {
            "aggregation": "token-sum", "baseline": ["mean", "otb", "mean", "otb"],
            "group_size": [2, 2, 4, 4], "variance": 0.0, "ci_low": 0.0, "ci_high": 0.0,
            "equivalent_mean_group_size": 2.0, "equivalent_range": "below",
        }
    )  # fmt: skip
    ax = plots_variance.fig_variance_vs_group_size(table, mark=("otb", 4)).axes[0]
    assert not any("N′" in t.get_text() for t in ax.texts)
    assert [line.get_linestyle() for line in ax.get_lines()].count(":") == 0
    below = table.assign(variance=[1.0, 2.0, 0.5, 1.5])
    ax = plots_variance.fig_variance_vs_group_size(below, mark=("otb", 4)).axes[0]
    assert [t.get_text() for t in ax.texts if "N′" in t.get_text()] == [" N′ ≤ 2.0"]


def test_equal_knees_are_drawn_apart_and_the_lowest_has_a_tick_below() -> None:
    """mean and rloo share their knee (rloo's advantages are mean's times N/(N−1)): their points
    sit a little apart about each N, in the baselines' order; the lowest point (593 tokens) has
    a labelled tick at or below it (the axis used to start above 500 with its first label at
    1,000, so "≥ 593" could not be read)."""
    rows = [
        {"aggregation": "token-sum", "baseline": b, "group_size": n, "grad_sq_resolved": False,
         "noise_scale_tokens": math.nan, "noise_scale_tokens_low": low,
         "noise_scale_tokens_high": math.inf}
        for b, lows in (("none", (593.0, 778.0)), ("mean", (2350.0, 1850.0)),
                        ("rloo", (2350.0, 1850.0)))
        for n, low in zip((2, 4), lows, strict=True)
    ]  # fmt: skip
    fig = plots_variance.fig_knee_tokens(pd.DataFrame(rows))
    fig.canvas.draw()
    ax = fig.axes[0]
    lines = {line.get_label(): line for line in ax.get_lines()}
    xs = {b: lines[f"{b} (≥)"].get_xdata() for b in ("none", "mean", "rloo")}
    assert (xs["none"] < xs["mean"]).all() and (xs["mean"] < xs["rloo"]).all()
    np.testing.assert_allclose(xs["mean"], [2, 4])  # the middle one of three stays on N
    np.testing.assert_allclose(lines["mean (≥)"].get_ydata(), lines["rloo (≥)"].get_ydata())
    low, high = ax.get_ylim()
    ticks = [t.get_position()[1] for t in ax.get_yticklabels() if t.get_text()]
    ticks = [t for t in ticks if low <= t <= high]
    assert min(ticks) <= 593 and max(ticks) >= 2350
    assert "500" in [t.get_text() for t in ax.get_yticklabels()]


def test_arms_sharing_a_baseline_get_a_colour_each() -> None:
    """grpo at N = 4 and at N = 16 beside otb: three colours (the tokens-to-target panel draws
    markers, where a line style cannot tell two arms apart); arms of distinct baselines keep
    their baselines' colours."""
    table, _ = dynamics_table()
    rows = {
        "grpo N=4": table[table["run"] == "otb N=4"],
        "grpo N=16": table[table["run"] == "mean N=16"],
    }
    rows["otb N=4"] = rows["grpo N=4"]
    frames = [r.assign(run=arm, baseline=arm.split()[0]) for arm, r in rows.items()]
    both = pd.concat(frames, ignore_index=True)

    def arm(name: str) -> SimpleNamespace:
        baseline, n = name.split()[0], int(name.split("=")[1])
        return SimpleNamespace(arm=name, baseline=baseline, group_size=n, runs=[name],
                               collapse_steps=[None], reached=1, tokens_to_target=[2000.0],
                               tokens_to_target_mean=2000.0, tokens_to_target_low=None,
                               tokens_to_target_high=None)  # fmt: skip

    def colours(names: list[str]) -> list[str]:
        fig = plots_dynamics.fig_baseline_comparison(
            both[both["run"].isin(names)], [arm(n) for n in names], {n: n for n in names}, 0.5
        )
        return [to_hex(c.lines[0].get_color()) for c in fig.axes[2].containers]

    shared = colours(["grpo N=4", "otb N=4", "grpo N=16"])
    assert len(set(shared)) == 3
    assert colours(["grpo N=4", "otb N=4"]) == [to_hex(baseline_color(b)) for b in ("grpo", "otb")]


def test_steps_vs_tokens_draws_each_arms_mean_runs_and_intervals() -> None:
    """Every arm at (its mean tokens, its mean updates) to the target, its bars the two
    intervals, its runs as open dots, k/n in its label; an arm no run of which reached the
    target draws no mean; without --target the figure says so."""

    def arm(name: str, tokens: list, updates: list, interval: bool) -> SimpleNamespace:
        reached = [t for t in tokens if t is not None]
        spread = (0.5, 1.5) if interval else (None, None)
        mean_t = float(np.mean(reached)) if reached else None
        mean_u = float(np.mean([u for u in updates if u is not None])) if reached else None
        return SimpleNamespace(
            arm=name, baseline=name.split()[0], group_size=4, runs=[f"{name}#{i}" for i in
            range(len(tokens))], reached=len(reached), tokens_to_target=tokens,
            updates_to_target=updates, tokens_to_target_mean=mean_t,
            updates_to_target_mean=mean_u,
            tokens_to_target_low=mean_t * spread[0] if interval and mean_t else None,
            tokens_to_target_high=mean_t * spread[1] if interval and mean_t else None,
            updates_to_target_low=mean_u * spread[0] if interval and mean_u else None,
            updates_to_target_high=mean_u * spread[1] if interval and mean_u else None,
        )  # fmt: skip

    arms = [
        arm("grpo P=4", [1000.0, 3000.0], [40, 80], True),
        arm("grpo P=16", [8000.0, None], [20, None], False),
        arm("otb P=4", [None, None], [None, None], False),
    ]
    fig = plots_dynamics.fig_steps_vs_tokens(arms, 0.5)
    ax = fig.axes[0]
    apart = [dodged([1.0], k, len(arms))[0] for k in range(len(arms))]  # each arm's factor
    means = np.array([c.lines[0].get_xydata()[0] for c in ax.containers])
    np.testing.assert_allclose(means, [[2000.0, 60.0 * apart[0]], [8000.0, 20.0 * apart[1]]])
    bars = ax.containers[0].lines[2]  # the x bar, then the y bar
    np.testing.assert_allclose(bars[0].get_segments()[0], [[1000.0, 60.0 * apart[0]],
                                                         [3000.0, 60.0 * apart[0]]])  # fmt: skip
    np.testing.assert_allclose(bars[1].get_segments()[0], [[2000.0, 30.0 * apart[0]],
                                                         [2000.0, 90.0 * apart[0]]])  # fmt: skip
    dots = {line.get_marker(): line.get_xydata() for line in drawn_lines(ax)
            if line.get_markerfacecolor() == "none"}  # fmt: skip
    np.testing.assert_allclose(dots["o"], [[1000.0, 40.0 * apart[0]], [3000.0, 80.0 * apart[0]]])
    np.testing.assert_allclose(dots["s"], [[8000.0, 20.0 * apart[1]]])  # the second arm's marker
    assert legend_labels(ax) == ["grpo P=4 (2/2 reached)", "grpo P=16 (1/2 reached)"]
    assert ax.get_xscale() == ax.get_yscale() == "log"
    untold = plots_dynamics.fig_steps_vs_tokens(arms, None).axes[0]
    assert "no --target" in untold.texts[0].get_text()
    nobody = plots_dynamics.fig_steps_vs_tokens(arms[2:], 0.5).axes[0]
    assert "no arm reached the score 0.5" in nobody.texts[0].get_text()


@pytest.mark.renders  # reads the rendered figure
def test_two_arms_at_one_point_both_show_and_the_log_axes_are_labelled() -> None:
    """Two arms that reached the target at the same tokens and updates (one dot hid the other):
    each keeps its own marker, a little apart; a narrow range (2,000 to 5,000 tokens, 20 to 40
    updates) is labelled at three or more ticks on each axis, not at its two ends."""

    def arm(name: str) -> SimpleNamespace:
        return SimpleNamespace(
            arm=name, baseline=name.split()[0], group_size=4, runs=[f"{name}#0", f"{name}#1"],
            reached=2, tokens_to_target=[2100.0, 4800.0], updates_to_target=[22, 38],
            tokens_to_target_mean=3450.0, updates_to_target_mean=30.0,
            tokens_to_target_low=2500.0, tokens_to_target_high=4400.0,
            updates_to_target_low=25.0, updates_to_target_high=35.0,
        )  # fmt: skip

    fig = plots_dynamics.fig_steps_vs_tokens([arm("grpo P=4"), arm("otb P=4")], 0.5)
    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    ax = fig.axes[0]
    first, second = (c.lines[0] for c in ax.containers)
    assert first.get_marker() != second.get_marker()
    assert first.get_xydata()[0, 1] != second.get_xydata()[0, 1]  # apart in updates
    for axis, (low, high) in ((ax.xaxis, ax.get_xlim()), (ax.yaxis, ax.get_ylim())):
        ticks = axis.get_majorticklabels()
        shown = [t for t in ticks if t.get_text() and low <= t.get_position()[axis is ax.yaxis]
                 <= high]  # fmt: skip
        assert len(shown) >= 3, [t.get_text() for t in shown]


# --- dynamics: every point drawn, panels that name what they draw, no "?" ---------------------


def gappy_table() -> tuple[pd.DataFrame, list[SimpleNamespace]]:
    """A knee controller's run as dynamics.csv holds it: `grad_norm` only where an update
    closed (steps 1, 2, 4 and, alone after a gap, 9: issue 53's undrawn last norm), a score and
    the live metrics at every step, OTB/mean missing at step 3 (equal rewards); and a run whose
    log names neither its baseline nor its group size."""
    steps = np.arange(1, 10)
    grad = np.full(9, np.nan)
    grad[[0, 1, 3, 8]] = [2.0, 3.0, 2.5, 3.335]
    knee = pd.DataFrame({
        "run": "knee", "step": steps, "grad_norm": grad, "score": np.linspace(0.2, 0.6, 9),
        "variance_proxy": np.linspace(1.0, 2.0, 9), "tokens_sampled": 100.0 * steps,
        "baseline": "grpo", "group_size": 4.0,
        "otb/energy/sequence_mean": np.linspace(0.3, 0.5, 9),
        "otb/otb_over_mean/proxy2_total_power": [0.4, 0.5, np.nan, 0.6, 0.3, 0.2, 0.7, 0.5, 0.4],
        "otb/controller/prompts_per_update": [2, 2, 4, 4, 16, 16, 16, 16, 14],
    })  # fmt: skip
    bare = pd.DataFrame({
        "run": "bare", "step": steps, "grad_norm": 1.0 + 0.1 * steps, "score": 0.3,
        "variance_proxy": np.nan, "tokens_sampled": 80.0 * steps, "baseline": None,
        "group_size": np.nan,
    })  # fmt: skip
    runs = [SimpleNamespace(run=r, collapse_step=None, warning_step=None, tokens_to_target=None,
                            variance_proxy_kind="proxy2") for r in ("knee", "bare")]  # fmt: skip
    return pd.concat([knee, bare], ignore_index=True), runs


def test_every_point_of_the_table_is_drawn() -> None:
    """Each run's every logged grad_norm (a lone one too, step 9 after a gap), score and
    variance proxy is seen on the figures that draw it: on a line beside a neighbour or as a
    dot; and a panel bridging the steps that logged no norm marks the ones that did."""
    table, runs = gappy_table()
    top, bottom = plots_dynamics.fig1_grad_norm_and_score(table, runs).axes
    proxy, norms = plots_dynamics.fig2_variance_and_grad_norm(table, runs).axes
    live = plots_dynamics.fig_live_otb(table, runs).axes
    tokens = plots_dynamics.fig_score_vs_tokens(table, runs, target=None).axes[0]
    arms = [SimpleNamespace(arm=r, baseline=None, group_size=None, runs=[r], collapse_steps=[None],
                            reached=0, tokens_to_target=[None], tokens_to_target_mean=None,
                            tokens_to_target_low=None, tokens_to_target_high=None)
            for r in ("knee", "bare")]  # fmt: skip
    compared = plots_dynamics.fig_baseline_comparison(
        table.assign(score_smoothed=np.nan), arms, {"knee": "knee", "bare": "bare"}, None
    ).axes
    for ax, x, y in ((top, "step", "grad_norm"), (norms, "step", "grad_norm"),
                     (live[0], "step", "grad_norm"), (bottom, "step", "score"),
                     (proxy, "step", "variance_proxy"), (tokens, "tokens_sampled", "score"),
                     (compared[0], "tokens_sampled", "score"),
                     (compared[1], "tokens_sampled", "grad_norm"),
                     (live[1], "step", "otb/energy/sequence_mean"),
                     (live[3], "step", "otb/otb_over_mean/proxy2_total_power")):  # fmt: skip
        for run, rows in table.groupby("run"):
            if y in rows:
                assert not unseen(rows, x, y, ax), (ax.get_ylabel(), run, unseen(rows, x, y, ax))
    assert (9.0, 3.335) in visible_points(top)


def test_the_live_panels_name_what_they_draw_and_draw_the_dashboards_key() -> None:
    """Every panel's title gives the metric in words and its key; the OTB/mean panel draws the
    key the dashboard shows (`metric_levels.HEADLINE`'s, issue 53: the figure drew
    token_total_power's ratio, 0.108 at a step where the dashboard showed proxy2's 0.395), and
    every panel's key is the dashboard's where the dashboard has one of its quantity."""
    headline = {"otb/" + k for k in HEADLINE if "{own}" not in k}
    ratio = [k for k in headline if k.startswith("otb/otb_over_mean/") and "zero_tail" not in k]
    panels = {p.key: p for p in plots_dynamics.LIVE_PANELS}
    assert ratio and ratio[0] in panels  # the dashboard's OTB/mean
    assert "otb/energy/sequence_mean" in headline and "otb/energy/sequence_mean" in panels
    assert set(panels) - headline == {"otb/energy/group_cv_median"}  # the full record's only
    assert not any(k.startswith("otb/energy/group_cv") for k in headline)
    table, runs = gappy_table()
    axes = plots_dynamics.fig_live_otb(table, runs).axes
    assert axes[0].get_title(loc="left").endswith("\ngrad_norm")
    for ax, panel in zip(axes[1:], plots_dynamics.LIVE_PANELS, strict=True):
        assert ax.get_title(loc="left") == f"{panel.words}\n{panel.key}"


def test_an_empty_live_panel_says_why() -> None:
    """`otb-diag train`'s log has the split and none of the panels' metrics (issue 53: three
    empty panels, one saying "no positive energy logged", two nothing): each names the key it
    has no value of, whether the column is absent or NaN at every step; a log axis whose
    values are none positive says that."""
    table, runs = gappy_table()
    bare = table[table["run"] == "bare"]
    own = bare.drop(columns=[c for c in bare if c.startswith("otb/")])  # its log alone
    for demo in (own, bare):  # alone; beside the knee run's, its columns NaN
        axes = plots_dynamics.fig_live_otb(demo, runs[1:]).axes
        for ax, panel in zip(axes[1:], plots_dynamics.LIVE_PANELS, strict=True):
            (said,) = [t.get_text() for t in ax.texts if panel.key in t.get_text()]
            assert said.startswith(f"no value of {panel.key} in the log")
    zero = bare.assign(**{"otb/energy/sequence_mean": 0.0})
    axes = plots_dynamics.fig_live_otb(zero, runs[1:]).axes
    assert "no positive otb/energy/sequence_mean logged" in [t.get_text() for t in axes[1].texts]


def test_no_legend_holds_a_question_mark() -> None:
    """A log that names no baseline nor group size reads "baseline not logged, N not logged"
    in the score-against-tokens legend (it read "?, N=4"); no dynamics figure's legend holds a
    "?"."""
    table, runs = gappy_table()
    figures = [
        plots_dynamics.fig1_grad_norm_and_score(table, runs),
        plots_dynamics.fig2_variance_and_grad_norm(table, runs),
        plots_dynamics.fig_live_otb(table, runs),
        plots_dynamics.fig_score_vs_tokens(table, runs, target=None),
    ]
    legends = [t for fig in figures for ax in fig.axes if ax.get_legend()
               for t in legend_labels(ax)]  # fmt: skip
    assert legends and not [t for t in legends if "?" in t]
    assert legend_labels(figures[-1].axes[0]) == ["grpo, N=4", "baseline not logged, N not logged"]


@pytest.mark.renders  # reads the rendered figure
def test_fig3s_legend_covers_no_bar(energy) -> None:
    """The legend sits off the bars (inside the axes it covered the tallest, bar 7)."""
    sequences, _, group = energy
    tall = sequences.copy()
    rows = tall["group"] == group
    tall.loc[rows, "energy"] = tall.loc[rows, "energy"].max()  # every bar at the top
    fig = plots_energy.fig3_sequence_energy(tall, group)
    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    renderer = canvas.get_renderer()
    ax = fig.axes[0]
    legend = ax.get_legend().get_window_extent(renderer)
    assert not [p for p in ax.patches if p.get_window_extent(renderer).overlaps(legend)]
