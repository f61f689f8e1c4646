"""Every figure the project draws, one entry each: its file stem, the plot function, the data it
needs, the command that writes it, its caption for the report, and whether `otb-diag figures`
keeps it. The commands draw their figures with `save_figures`, `report` captions them and
`figures` collects them by looping over `FIGURES`; no other module spells a figure's name.

To add a figure: a function `tables -> Figure` in `plots/energy.py`, `variance.py` or
`dynamics.py`, and one `FigureEntry` below naming the fields of its command's figure data
(`figure_data.py`) it needs."""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from otb_diag.plots.figure_data import FIGURE_DATA, FigureData

if TYPE_CHECKING:
    from matplotlib.figure import Figure

MODES = ("proxy", "head", "full")  # variance-compare's score modes, in the order files are read


@dataclass(frozen=True)
class FigureEntry:
    """One figure. `plot` names its function as `module.function` under `otb_diag/plots/`
    (imported when drawn, so that `report`, which needs the captions only, loads neither
    matplotlib nor torch). `needs` maps each argument of the plot to the field of the command's
    figure data (`figure_data.py:FIGURE_DATA`) that supplies it; the figure is drawn when the
    field `drawn_when` (default: the first need) holds data, and drawing it without another
    need it may lack is an error. With `modes`, one file per mode, `<stem>_<mode>.png`;
    `in_set`: `otb-diag figures` keeps it (the exact mode's file); `in_sweep`: it also keeps
    the learning-rate sweep's copy."""

    stem: str
    command: str
    plot: str
    needs: Mapping[str, str]
    caption: str
    modes: tuple[str, ...] = ()
    in_set: bool = True
    in_sweep: bool = False
    drawn_when: str | None = None

    @property
    def trigger(self) -> str:
        """The figure-data field whose data this figure draws (None there: not drawn)."""
        return self.drawn_when or next(iter(self.needs.values()))

    @property
    def always(self) -> bool:
        """Whether every run of its command has this figure's data (its trigger is no field
        that a run may leave None)."""
        fields = {f.name: f for f in dataclasses.fields(FIGURE_DATA[self.command])}
        return fields[self.trigger].default is not None

    def file_stem(self, mode: str | None = None) -> str:
        """The file's name without its suffix: `<stem>_<mode>` for a per-mode figure."""
        return f"{self.stem}_{mode}" if self.modes else self.stem

    def file_stems(self) -> list[str]:
        """Every file this figure can be written as, in reading order."""
        return [self.file_stem(m) for m in self.modes] if self.modes else [self.stem]

    def mode_of(self, file_stem: str) -> str | None:
        """The mode a file of this figure was drawn for (None: not per mode)."""
        return file_stem.removeprefix(self.stem + "_") if self.modes else None

    @property
    def plot_function(self) -> Callable[..., Figure]:
        module, name = self.plot.rsplit(".", 1)
        return getattr(importlib.import_module(f"otb_diag.plots.{module}"), name)

    def drawn(self, data: FigureData) -> bool:
        """Whether `data` holds this figure's data; raises `ValueError` naming the needs it
        lacks (a field that may be absent, None) when it holds the data but not them."""
        if getattr(data, self.trigger) is None:
            return False
        optional = {f.name for f in dataclasses.fields(data) if f.default is None}
        missing = [k for k in self.needs.values() if k in optional and getattr(data, k) is None]
        if missing:
            raise ValueError(
                f"figure {self.stem} needs {', '.join(missing)}: the "
                f"{type(data).__name__} handed over has none"
            )
        return True

    def draw(self, data: FigureData) -> Figure:
        args = {arg: getattr(data, field) for arg, field in self.needs.items()}
        return self.plot_function(**args)


FIGURES = (
    FigureEntry(
        "fig3_sequence_energy",
        "energy",
        "energy.fig3_sequence_energy",
        {"sequences": "sequences", "group": "group"},
        "Each bar is one response of the group shown (the most heterogeneous group with mixed "
        "rewards, or --group), its height the total realized energy W(τ) = Σ_t w_t; green "
        "bars earned a reward. Very unequal bars mean one group baseline weights gradients of "
        "very different size alike, which the energy-weighted baselines (optseq, otb) correct.",
    ),
    FigureEntry(
        "fig4_cumulative_energy",
        "energy",
        "energy.fig4_cumulative_energy",
        {"tokens": "group_tokens", "samples": "shown", "group": "group"},
        "Each line is one response's cumulative energy W_t against its position t (up to 8 "
        "responses with distinct profiles, spread over the group's energies; responses with "
        "identical profiles share one line and one legend entry). The box lists the responses "
        "from lowest to highest W_t at the dotted positions (25/50/75 % of the longest shown): "
        "when that order changes along t, no sequence-level weight is right at every token.",
    ),
    FigureEntry(
        "fig5_probability_vs_gradient",
        "energy",
        "energy.fig5_probability_vs_gradient",
        {"tokens": "sampled_tokens", "vocab_size": "vocab_size"},
        "Each hexagon counts generated tokens by their probability p_t (x) and logit-gradient "
        "norm w_t (y, τ = 1 units), log colour scale; the dashed curves are the analytic bounds "
        "of w for a given p. Confident tokens (p_t → 1) carry almost no gradient; points "
        "outside the bounds would mean a bug.",
    ),
    FigureEntry(
        "fig_energy_by_step",
        "energy",
        "energy.fig_energy_by_step",
        {"sequences": "sequences_by_step"},
        "Distribution of sequence energy W(τ) at each checkpoint (box: quartiles, line: "
        "median, whiskers: 1.5 IQR, dots beyond; log scale): how the gradient magnitude of "
        "the same rollouts changes as training proceeds.",
    ),
    FigureEntry(
        "variance_vs_n",
        "variance-compare",
        "variance.fig_variance_vs_group_size",
        {"table": "variance_rows", "aggregation": "aggregation"},
        "Variance of the policy-gradient estimate (trace of its covariance over the paired "
        "draws, log scale) against the group size N, one line per baseline, the bars its 95 % "
        "interval, the one the verdicts read (the bootstrap over draws widened for the random "
        "projection of the scores: wide in head mode), each baseline's points a little apart "
        "about N. The title names the score mode. Lower is better. The dotted read-off goes "
        "from OTB at N = 4 "
        "across to the mean baseline's curve: the N′ where it meets it is the group size the "
        "mean baseline needs for OTB's variance (its point estimate; N′'s 95 % interval and the "
        "verdicts read off it are in the verdicts above). No read-off where a variance on the "
        "way is 0.",
        modes=MODES,
    ),
    FigureEntry(
        "ratio_to_mean",
        "variance-compare",
        "variance.fig_ratio_to_mean",
        {"table": "variance_rows", "aggregation": "aggregation"},
        "Each bar is a baseline's variance divided by the mean baseline's at the same N (log "
        "scale), its error bar the 95 % interval the verdicts read; bars below the line at 1 "
        "beat the group mean, a bar whose interval reaches across the line does not settle it. "
        "rloo/mean = (N/(N−1))² by construction (the mean baseline shrinks the gradient by "
        "(N−1)/N). The title names the score mode.",
        modes=MODES,
    ),
    FigureEntry(
        "knee_tokens",
        "variance-compare",
        "variance.fig_knee_tokens",
        {"table": "noise_rows", "aggregation": "noise_aggregation"},
        "Tokens a step costs at the gradient noise scale, B·N·L̄ (B = tr Σ/|G|² prompts, N "
        "responses each, L̄ tokens a response), against N, one line per baseline with its 95 % "
        "jackknife interval over prompts (an interval open above runs to the top). Lower is "
        "cheaper: past the knee, more prompts per step buy little. Where |G|² is not resolved "
        "from zero, a hollow ▲ marks the bound: the knee costs at least that. The baselines' "
        "points sit a little apart about each N, so that equal knees (mean's and rloo's) both "
        "show.",
        modes=("head", "full"),  # proxy scores carry no signal: no knee
    ),
    FigureEntry(
        "proxy_fidelity",
        "variance-compare",
        "variance.fig_proxy_fidelity",
        {"tokens": "fidelity_tokens"},
        "Each hexagon counts tokens by the forward-only proxy w_t (x) and the true per-token "
        "squared gradient norm (y), both log scale, log colour. A narrow rising band means "
        "the proxy orders tokens as the real gradients do (Spearman ρ in the title).",
    ),
    FigureEntry(
        "variance_by_block",
        "variance-compare",
        "variance.fig_variance_by_block",
        {"blocks": "block_rows", "aggregation": "aggregation"},
        "Where the gradient variance lives (full mode, --by-block): the trace of the covariance "
        "of the gradient estimate restricted to each parameter block, one bar per baseline, at "
        "N = 4 (or the largest N below it), log scale.",
        in_set=False,
    ),
    FigureEntry(
        "fig1_grad_norm_and_score",
        "dynamics",
        "dynamics.fig1_grad_norm_and_score",
        {"table": "table", "runs": "runs"},
        "Top: gradient norm per logged step (log scale); bottom: score (mean reward). One line "
        "per run: colour = baseline, line style = group size. A dotted vertical line in a "
        "run's colour marks its detected collapse (none drawn: none detected).",
        in_sweep=True,
    ),
    FigureEntry(
        "fig2_variance_and_grad_norm",
        "dynamics",
        "dynamics.fig2_variance_and_grad_norm",
        {"table": "table", "runs": "runs"},
        "Top: the logged variance proxy; bottom: the gradient norm (both log scale). Dashed "
        "vertical line: the variance warning, dotted: the collapse; the distance between them "
        "is the lead time a monitor would have had.",
    ),
    FigureEntry(
        "fig_live_otb",
        "dynamics",
        "dynamics.fig_live_otb",
        {"table": "table", "runs": "live_runs"},
        "The OTB diagnostics the trainer logged at every step (docs/live.md) beside its "
        "gradient norm, each panel titled with the metric in words and the key it is logged "
        "under: mean realized energy, its median spread within a group, and OTB's variance "
        "proxy over the mean baseline's, the ratio the dashboard shows (below the dashed line "
        "at 1 OTB would cut the step's variance). A panel with no value to draw says why. "
        "Under the knee controller the gradient norm is logged where an update closed: its "
        "line runs across the other steps, a dot at each logged one. A dotted vertical line "
        "marks a detected collapse.",
        in_set=False,
        drawn_when="live_runs",
    ),
    FigureEntry(
        "pooled_noise_scale",
        "dynamics",
        "dynamics.fig_pooled_noise_scale",
        {"budget": "budget", "table": "table"},
        "The gradient noise scale B (prompts an update at the knee) pooled over the split "
        "steps a trainer logged so far (a window of the latest; docs/noise-scale.md), per "
        "estimator its 95 % band and, where |G|² is resolved from 0, the knee B as filled dots "
        "on a line; where it is not, B is no estimate and only its lower bound is drawn, a "
        "hollow dot (the band runs off the top), or a hollow triangle at the top where |G|² is "
        "at most 0 over its whole interval (no signal measurable, no bound); a grey tick marks "
        "a step pooled from one split step, which has no interval yet. The dashed line is P, "
        "the prompts a step sampled; under the knee controller the solid line is the prompts "
        "of the update each step's batch belonged to, as applied. Where the prompts an update "
        "takes sit under the band, the run trains below its knee.",
        in_set=False,
    ),
    FigureEntry(
        "score_vs_tokens",
        "dynamics",
        "dynamics.fig_score_vs_tokens",
        {"table": "table", "runs": "runs", "target": "target"},
        "Score against the running total of sampled tokens, each run labelled by its baseline "
        "and N ('baseline not logged' where its log names none): a run further left reaches a "
        "score with fewer tokens (a larger N costs tokens per step). With --target, the dotted "
        "line is the target and a dot marks where each run first reaches it.",
    ),
    FigureEntry(
        "baseline_comparison",
        "dynamics",
        "dynamics.fig_baseline_comparison",
        {"table": "table", "arms": "arms", "arm_of": "arm_of", "target": "target"},
        "Baselines compared at equal tokens: each run's trailing-mean score (top) and gradient "
        "norm (bottom, log scale) against the tokens it sampled, coloured by arm (the runs "
        "sharing a --label: one baseline at one group size, one run per seed). With --target, "
        "a dot on the target line marks each arm's mean tokens to reach it and the bar its "
        "95 % t interval over the seeds that did (k/n of them); a cross marks a run's "
        "detected collapse.",
        in_set=False,
        drawn_when="arms",
    ),
    FigureEntry(
        "steps_vs_tokens",
        "dynamics",
        "dynamics.fig_steps_vs_tokens",
        {"arms": "arms", "target": "target"},
        "Optimizer updates against tokens sampled to reach the --target score, every arm on "
        "one plot (log axes): hollow markers the runs that reached it, the filled one the arm's "
        "mean over them with 95 % t intervals on both axes, a marker per arm, each arm's points "
        "a little apart in updates so that arms at one point stay visible. A larger batch moves "
        "an arm down (fewer "
        "sequential updates) and right (more tokens); with the knee controller several "
        "generation batches make one update. A bar that runs off an axis: its lower end is 0.",
        in_set=False,
        drawn_when="arms",
    ),
)


def figures_of(command: str) -> list[FigureEntry]:
    """The figures `command` writes, in reading order."""
    return [f for f in FIGURES if f.command == command]


def figure_names(command: str) -> str:
    """The figures `command` writes, as its help names them: the file stems (`<stem>_<mode>`
    for a figure per mode), then those drawn only when the run makes their data."""
    names = {e.stem + ("_<mode>" if e.modes else ""): e.always for e in figures_of(command)}
    always = ", ".join(name for name, a in names.items() if a)
    some = ", ".join(name for name, a in names.items() if not a)
    return always + (f" (+ {some} when the run makes their data)" if some else "")


def save_figures(command: str, data: FigureData, out: Path, mode: str | None = None) -> list[str]:
    """Draw and save (PNG + PDF, `plots/style.py:save_figure`) each figure of `command` whose
    data `data` (the command's record, `figure_data.py:FIGURE_DATA`) holds: with `mode`, the
    per-mode figures of that mode; without, the others. Returns the file names written."""
    from otb_diag.plots.style import save_figure  # matplotlib: only when drawing

    if not isinstance(data, FIGURE_DATA[command]):
        raise TypeError(f"{command}'s figures read a {FIGURE_DATA[command].__name__}")
    files: list[str] = []
    for entry in figures_of(command):
        if (mode not in entry.modes) if mode is not None else bool(entry.modes):
            continue
        if entry.drawn(data):
            fig = entry.draw(data)
            files += [p.name for p in save_figure(fig, out, entry.file_stem(mode))]
    return files
