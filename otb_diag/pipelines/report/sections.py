"""The figures and tables of the report, per run: each figure with a caption that says how to
read it, each table with the units and definitions of its columns beside it."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from otb_diag.pipelines.regress.run_metrics import read_fidelity
from otb_diag.pipelines.report import html
from otb_diag.pipelines.results.dynamics import DynamicsResult
from otb_diag.pipelines.results.energy import EnergyResult
from otb_diag.pipelines.results.read import Result
from otb_diag.pipelines.results.train import TrainResult
from otb_diag.pipelines.results.variance import (
    HIGH,
    LOW,
    PAPER_TOKEN_SAVING,
    VarianceResult,
    bracketed,
    n_bound,
    percent,
    saving_bound,
)
from otb_diag.plots.registry import figures_of


@dataclass(frozen=True)
class Run:
    """One run directory found under a RUN_DIR: its command's result (read from summary.json,
    train.json or collapse.json) and the label the report names it by."""

    directory: Path
    command: str
    result: Result  # the command's result, read back from its record file
    label: str
    root: Path  # the RUN_DIR it was found under


def figures(run: Run) -> list[tuple[str, str]]:
    """(file name, HTML) of each figure of the run that exists, in the registry's order."""
    found = []
    for entry in figures_of(run.command):
        for stem in entry.file_stems():
            path = run.directory / f"{stem}.png"
            if not path.is_file():
                continue
            mode = entry.mode_of(stem)
            caption = entry.caption + (f" Mode: {mode}." if mode else "")
            caption += f" Run {run.label}; the command that redraws it is under Provenance."
            found.append((path.name, html.figure(path, f"{stem} ({run.label})", caption)))
    return found


def _number(x: Any, fmt: str = "{:.4g}") -> str:
    """A table cell: numbers formatted, text as it is, missing values as an em dash."""
    if x is None or (isinstance(x, float) and pd.isna(x)):
        return "—"
    return fmt.format(x) if isinstance(x, (int, float)) and not isinstance(x, bool) else str(x)


def _step(step: int | None) -> str:
    """A step cell: the whole number, or an em dash."""
    return _number(step, "{}")


def variance_tables(run: Run) -> str:
    result: VarianceResult = run.result
    if not result.signal.carries_any:
        return html.paragraph(
            f"No table: {result.signal.sentence()}; nothing was measured ({run.label}).",
            class_="absent",
        )
    max_n = max(h.group_size for h in result.headline)  # measured: requested N ≤ M/2
    head = html.table(
        ["mode", "aggregation", "N", "OTB/mean [95 %]", "OTB < mean", "OTB/RLOO",
         "mean-equivalent N′ [95 %]", "saving [95 %]"],
        [
            (
                h.mode,
                h.aggregation,
                h.group_size,
                _number(h.otb_ratio_to_mean, "{:.3f}")
                + f" {bracketed(h.otb_ratio_to_mean_low, h.otb_ratio_to_mean_high)}",
                h.otb_below_mean,
                _number(h.otb_ratio_to_rloo, "{:.3f}"),
                f"{n_bound(h.equivalent_mean_group_size, h.equivalent_range, max_n)} "
                f"[{n_bound(h.equivalent_low, h.equivalent_low_range, max_n, LOW)}, "
                f"{n_bound(h.equivalent_high, h.equivalent_high_range, max_n, HIGH)}]",
                f"{saving_bound(h.token_savings, h.equivalent_range)} "
                f"[{saving_bound(h.token_savings_low, h.equivalent_low_range, LOW)}, "
                f"{saving_bound(h.token_savings_high, h.equivalent_high_range, HIGH)}]",
            )
            for h in result.headline
        ],
        caption=f"OTB against the mean baseline ({run.label})",
    )  # fmt: skip
    parts = [head, _VARIANCE_DEFS]
    table = pd.read_csv(run.directory / "variance.csv")
    if "step" in table:
        table = table[table["step"] == table["step"].max()]
    agg = result.aggregation
    for mode, rows in table[table["aggregation"] == agg].groupby("mode", sort=False):
        sizes = sorted(rows["group_size"].unique())
        body = []
        for baseline, per in rows.groupby("baseline", sort=False):
            per = per.set_index("group_size")
            body.append(
                [baseline]
                + [
                    f"{per.at[n, 'variance']:.3g} [{per.at[n, 'ci_low']:.3g}, "
                    f"{per.at[n, 'ci_high']:.3g}]; z {per.at[n, 'bias_z']:.2g}"
                    if n in per.index
                    else "—"
                    for n in sizes
                ]
            )
        parts.append(
            html.table(
                ["baseline"] + [f"N = {n}" for n in sizes],
                body,
                caption=f"Variance [95 % interval]; bias z, {mode} mode, {agg} ({run.label})",
            )
        )
    parts.append(
        html.definitions(
            [
                ("variance", "trace of the sample covariance of ĝ over the R paired draws "
                 "(1/(R−1)), in squared units of the projected score vectors"),
                ("[lo, hi]", "bootstrap 95 % interval over the draws (projection fixed)"),
                ("z", "bias z-score against no baseline: ≈ 1 when the baseline leaves the mean "
                 "gradient unmoved; mean/optseq/otb shrink it by (N−1)/N, which shows here"),
            ]
        )
    )  # fmt: skip
    fidelity = read_fidelity(run.directory / "fidelity.csv")
    if len(fidelity):
        parts.append(
            html.table(
                list(fidelity.columns),
                [[_number(v, "{:.4g}") for v in row] for row in fidelity.itertuples(index=False)],
                caption=f"Proxy fidelity ({run.label})",
            )
        )
        parts.append(html.definitions(_FIDELITY_DEFS))
    return "".join(parts)


_VARIANCE_DEFS = html.definitions(
    [
        ("OTB/mean", "OTB's gradient variance divided by the mean baseline's at the same N "
         "(< 1: OTB is steadier)"),
        ("[95 %]", "the interval of each number: the variances' bootstrap intervals widened for "
         "the seeded projection, propagated through the mean curve (the ones regress uses)"),
        ("OTB < mean", "holds where OTB/mean's interval lies below 1, does not hold where it "
         "lies at or above 1, not resolved where it reaches 1"),
        ("OTB/RLOO", "the same against RLOO, which is unbiased"),
        ("N′", "group size at which the mean baseline's variance (interpolated log–log over "
         "the measured N) equals OTB's; > max N: beyond the measured range; ≤ min N: below it"),
        ("saving", "1 − N/N′: share of sampled tokens saved for the same gradient variance (≥: "
         "a lower bound when N′ is beyond the range, ≤: an upper one below it); not the "
         f"paper's > {percent(PAPER_TOKEN_SAVING)}, which is at equal score over training"),
    ]
)  # fmt: skip
_FIDELITY_DEFS = [
    ("token_spearman, token_pearson", "rank and linear correlation of w_t with the true "
     "‖∇θ log p_t‖² over generated tokens (head: output layer; full: every parameter)"),
    ("sequence_*", "the same between the summed energies Σ_t w_t and Σ_t ‖∇θ log p_t‖² "
     "per response"),
    ("tokens, sequences", "counts the correlations are over"),
]  # fmt: skip


def energy_tables(run: Run) -> str:
    result: EnergyResult = run.result
    proxies = result.proxies
    if proxies and all(
        isinstance(v, dict) and "proxy2_total_power" not in v for v in proxies.values()
    ):
        proxies = proxies[max(proxies)]  # several checkpoints: the last step's
    columns = ["proxy2_total_power", "expected_a_squared", "expected_w", "logit_total_power"]
    columns += ["token_total_power", "zero_tail/proxy2_total_power", "zero_tail/token_total_power"]
    rows = [[b] + [_number(p.get(c)) for c in columns] for b, p in proxies.items()]
    return html.table(
        ["baseline", *columns], rows, caption=f"Variance proxies per baseline ({run.label})"
    ) + html.definitions(
        [
            ("proxy2_total_power", "verl's number: mean_i Ā_i² · τ² W(τ_i), Ā_i the masked "
             "mean advantage of response i, verl's w = 1 − 2p + Σπ² (theory.md §4); means run "
             "over every response, empty ones included, as in verl"),
            ("expected_a_squared", "mean_i Ā_i²"),
            ("expected_w", "verl's mean sequence energy τ² W(τ) = Σ_t (1 − 2p + Σπ²)"),
            ("logit_total_power", "ours: proxy2_total_power in the raw logits' w = "
             "(1 − 2p + Σπ²)/τ², i.e. verl's over τ²"),
            ("token_total_power", "ours: mean over responses of Σ_t mask·w_t·A_t²: the proxy "
             "variance the token-level baselines minimise (lower is better)"),
            ("zero_tail/…", "OTB only: the part of its proxy that verl's zero tail adds (A = R "
             "on the strictly longest member's tokens beyond the second-longest); the rest is "
             "the proxy less it"),
        ]
    )  # fmt: skip


def dynamics_tables(run: Run) -> str:
    result: DynamicsResult = run.result
    header = ["run", "source", "baseline", "N", "steps", "collapse", "warning", "lead"]
    header += ["tokens to target", "variance proxy"]
    rows = [
        [r.run, r.source, r.baseline, r.group_size]
        + [f"{r.first_step}–{r.last_step}", r.collapse_step, r.warning_step]
        + [r.lead_steps, _number(r.tokens_to_target, "{:.3g}"), r.variance_proxy_kind]
        for r in result.runs
    ]
    return html.table(header, rows, caption=f"Collapse per run ({run.label})") + html.definitions(
        [
            ("collapse", "training step where the rule's gradient-norm surge starts (— none)"),
            ("warning", "step where the variance proxy first rose above its trailing baseline "
             "before the collapse"),
            ("lead", "collapse − warning, in training steps"),
            ("rule", result.rule.describe()),
        ]
    ) + _comparison_table(run) + _live_table(run)  # fmt: skip


def _comparison_table(run: Run) -> str:
    """The comparison at equal tokens, one row per arm (collapse.json's `arms`), when there are
    several runs."""
    arms = run.result.arms if isinstance(run.result, DynamicsResult) else []
    if not arms:
        return ""
    target = "target" if run.result.target is None else f"{run.result.target:g}"
    header = ["arm", "runs", "reached", f"tokens to {target}", "95 % interval"]
    header += [f"updates to {target}", "95 % interval", "final score", "collapses"]
    g3 = "{:.3g}"
    rows = [
        [a.arm, len(a.runs), f"{a.reached}/{len(a.runs)}", _number(a.tokens_to_target_mean, g3)]
        + [f"{_number(a.tokens_to_target_low, g3)} – {_number(a.tokens_to_target_high, g3)}"]
        + [_number(a.updates_to_target_mean, g3)]
        + [f"{_number(a.updates_to_target_low, g3)} – {_number(a.updates_to_target_high, g3)}"]
        + [_number(a.final_score_mean, "{:.3f}"), ", ".join(_number(c) for c in a.collapse_steps)]
        for a in arms
    ]
    caption = f"Baselines at equal tokens, runs sharing a label as one arm's seeds ({run.label})"
    return html.table(header, rows, caption=caption) + html.definitions(
        [
            (f"tokens to {target}", "mean over the arm's runs that reached the target of the "
             "tokens each sampled until its trailing-mean score first reached it"),
            (f"updates to {target}", "the same for the optimizer updates taken before the "
             "batch that reached it (step − 1, or the knee controller's count)"),
            ("95 % interval", "Student's t interval of each mean over those runs (≥ 2)"),
            ("collapses", "the collapse detector's step per run (— none)"),
        ]
    )  # fmt: skip


def _live_table(run: Run) -> str:
    """The live diagnostics' values per run (docs/live.md), when a run has them: each family
    of metrics from one step, the last that logged it, and that step beside each value."""
    live = run.result.live_runs if isinstance(run.result, DynamicsResult) else []
    if not live:
        return ""
    names = sorted({k for r in live for k in r.otb or {}})
    rows = [
        [name]
        + [
            cell
            for r in live
            for cell in (_number((r.otb or {}).get(name)), _step((r.otb_steps or {}).get(name)))
        ]
        for name in names
    ]
    caption = (
        f"Live OTB diagnostics at the last step that logged them ({run.label}): the metrics "
        "sharing all but the last part of their name are one step's, named in 'step' "
        "(— : not logged at that step; TRL leaves non-finite values out); meanings: docs/live.md"
    )
    header = ["metric", *(c for r in live for c in (r.run, "step"))]
    negative = [n for n in names if any(((r.otb or {}).get(n) or 0.0) < 0 for r in live)]
    return html.table(header, rows, caption=caption) + (
        html.definitions([("below 0", negative_note(negative))]) if negative else ""
    )


def negative_note(names: list[str]) -> str:
    """Why the live `names` logged below 0 (docs/live.md, the split): `‖G‖²` is unbiased, the
    squared norm of the mean gradient less the step's own noise, so on a step that resolves no
    signal it comes out below 0, and so do the terms that carry it (the SNR, a between-prompt
    spread whose noise correction exceeds it)."""
    return (
        f"{', '.join(names)}: unbiased estimates, a measured spread less its noise (‖G‖² is the "
        "squared norm of the mean gradient less the step's own noise; the SNR is P·‖G‖²/total), "
        "so they come out below 0 where the steps resolve no signal; read them as a trend over "
        "steps (docs/live.md, 'The within/between split and the SNR')"
    )


def train_tables(run: Run) -> str:
    result: TrainResult = run.result
    early, late, k = result.early, result.late, result.window
    rows = [[key, _number(early.get(key)), _number(late.get(key))] for key in early]
    return html.table(
        ["metric", f"first {k} step(s)", f"last {k} step(s)"],
        rows,
        caption=f"Training, early against late ({run.label})",
    ) + html.definitions(
        [
            ("mean_reward", "mean outcome reward of the step's rollouts"),
            ("grad_norm", "‖ĝ‖ before clipping"),
            ("entropy", "mean per-token entropy of the sampling policy, nats"),
            ("mean_response_length", "tokens per response"),
        ]
    )


TABLES = {
    "variance-compare": variance_tables,
    "energy": energy_tables,
    "dynamics": dynamics_tables,
    "train": train_tables,
}
