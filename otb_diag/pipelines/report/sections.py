"""The figures and tables of the report, per run: each figure with a caption that says how to
read it, each table with the units and definitions of its columns beside it."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from otb_diag.pipelines.regress.run_metrics import read_fidelity
from otb_diag.pipelines.report import html

# Figure file stem (mode suffix stripped) -> how to read it.
CAPTIONS = {
    "fig3_sequence_energy": (
        "Each bar is one response of the group shown (the most heterogeneous group with mixed "
        "rewards, or --group), its height the total realized energy W(τ) = Σ_t w_t; green "
        "bars earned a reward. Very unequal bars mean one group baseline weights gradients of "
        "very different size alike, which the energy-weighted baselines (optseq, otb) correct."
    ),
    "fig4_cumulative_energy": (
        "Each line is one response's cumulative energy W_t against its position t (up to 8 "
        "responses with distinct profiles, spread over the group's energies; responses with "
        "identical profiles share one line and one legend entry). The box lists the responses "
        "from lowest to highest W_t at the dotted positions (25/50/75 % of the longest shown): "
        "when that order changes along t, no sequence-level weight is right at every token."
    ),
    "fig5_probability_vs_gradient": (
        "Each hexagon counts generated tokens by their probability p_t (x) and logit-gradient "
        "norm w_t (y, τ = 1 units), log colour scale; the dashed curves are the analytic bounds "
        "of w for a given p. Confident tokens (p_t → 1) carry almost no gradient; points "
        "outside the bounds would mean a bug."
    ),
    "fig_energy_by_step": (
        "Distribution of sequence energy W(τ) at each checkpoint (box: quartiles, line: "
        "median, whiskers: 1.5 IQR, dots beyond; log scale): how the gradient magnitude of "
        "the same rollouts changes as training proceeds."
    ),
    "variance_vs_n": (
        "Variance of the policy-gradient estimate (trace of its covariance over the paired "
        "draws, log scale) against the group size N, one line per baseline, the band its 95 % "
        "bootstrap interval. Lower is better. The dotted read-off goes from OTB at N = 4 "
        "across to the mean baseline's curve: the N′ where it meets it is the group size the "
        "mean baseline needs for OTB's variance."
    ),
    "ratio_to_mean": (
        "Each bar is a baseline's variance divided by the mean baseline's at the same N (log "
        "scale); bars below the line at 1 beat the group mean. rloo/mean = (N/(N−1))² by "
        "construction (the mean baseline shrinks the gradient by (N−1)/N)."
    ),
    "proxy_fidelity": (
        "Each hexagon counts tokens by the forward-only proxy w_t (x) and the true per-token "
        "squared gradient norm (y), both log scale, log colour. A narrow rising band means "
        "the proxy orders tokens as the real gradients do (Spearman ρ in the title)."
    ),
    "fig1_grad_norm_and_score": (
        "Top: gradient norm per logged step (log scale); bottom: score (mean reward). One line "
        "per run: colour = baseline, line style = group size. A dotted vertical line in a "
        "run's colour marks its detected collapse (none drawn: none detected)."
    ),
    "fig2_variance_and_grad_norm": (
        "Top: the logged variance proxy; bottom: the gradient norm (both log scale). Dashed "
        "vertical line: the variance warning, dotted: the collapse; the distance between them "
        "is the lead time a monitor would have had."
    ),
    "knee_tokens": (
        "Tokens a step costs at the gradient noise scale, B·N·L̄ (B = tr Σ/|G|² prompts, N "
        "responses each, L̄ tokens a response), against N, one line per baseline with its 95 % "
        "jackknife interval over prompts; an arrow marks an interval open above. Lower is "
        "cheaper: past the knee, more prompts per step buy little. Only points whose |G|² is "
        "resolved from zero are drawn."
    ),
    "fig_live_otb": (
        "The OTB diagnostics the trainer logged at every step (docs/live.md) beside its "
        "gradient norm: mean realized energy, its median spread within a group, and OTB's "
        "variance proxy over the mean baseline's (below the dashed line at 1 OTB would cut the "
        "step's variance). A dotted vertical line marks a detected collapse."
    ),
    "score_vs_tokens": (
        "Score against the running total of sampled tokens: a run further left reaches a "
        "score with fewer tokens (a larger N costs tokens per step). With --target, the dotted "
        "line is the target and a dot marks where each run first reaches it."
    ),
}
FIGURES = {
    "energy": ["fig3_sequence_energy", "fig4_cumulative_energy", "fig5_probability_vs_gradient"]
    + ["fig_energy_by_step"],
    "variance-compare": [
        f"{f}_{m}" for m in ("proxy", "head", "full") for f in ("variance_vs_n", "ratio_to_mean")
    ]
    + [f"knee_tokens_{m}" for m in ("head", "full")]
    + ["proxy_fidelity"],
    "dynamics": ["fig1_grad_norm_and_score", "fig2_variance_and_grad_norm", "score_vs_tokens"]
    + ["fig_live_otb"],
    "train": [],
}


@dataclass(frozen=True)
class Run:
    """One run directory found under a RUN_DIR: its command's record (summary.json,
    train.json or collapse.json) and the label the report names it by."""

    directory: Path
    command: str
    record: dict[str, Any]
    label: str
    root: Path  # the RUN_DIR it was found under


def figures(run: Run) -> list[tuple[str, str]]:
    """(file name, HTML) of each figure of the run that exists, in reading order."""
    found = []
    for name in FIGURES[run.command]:
        path = run.directory / f"{name}.png"
        if not path.is_file():
            continue
        stem = name.removesuffix("_proxy").removesuffix("_head").removesuffix("_full")
        mode = name[len(stem) + 1 :]
        caption = CAPTIONS[stem] + (f" Mode: {mode}." if mode else "")
        caption += f" Run {run.label}; the command that redraws it is under Provenance."
        found.append((path.name, html.figure(path, f"{name} ({run.label})", caption)))
    return found


def _number(x: Any, fmt: str = "{:.4g}") -> str:
    """A table cell: numbers formatted, text as it is, missing values as an em dash."""
    if x is None or (isinstance(x, float) and pd.isna(x)):
        return "—"
    return fmt.format(x) if isinstance(x, (int, float)) and not isinstance(x, bool) else str(x)


def variance_tables(run: Run) -> str:
    summary = run.record
    max_n = max(h["group_size"] for h in summary["headline"])  # measured: requested N ≤ M/2
    head = html.table(
        ["mode", "aggregation", "N", "OTB/mean", "OTB/RLOO", "mean-equivalent N′", "saving"],
        [
            (
                h["mode"],
                h["aggregation"],
                h["group_size"],
                _number(h["otb_ratio_to_mean"], "{:.3f}"),
                _number(h["otb_ratio_to_rloo"], "{:.3f}"),
                f"> {max_n}"
                if h["equivalent_range"] == "beyond"
                else _number(h["equivalent_mean_group_size"], "{:.1f}"),
                _number(h["token_savings"], "{:.0%}"),
            )
            for h in summary["headline"]
        ],
        caption=f"OTB against the mean baseline ({run.label})",
    )
    parts = [head, _VARIANCE_DEFS]
    table = pd.read_csv(run.directory / "variance.csv")
    if "step" in table:
        table = table[table["step"] == table["step"].max()]
    agg = summary["settings"]["aggregations"][0]
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
        ("OTB/RLOO", "the same against RLOO, which is unbiased"),
        ("N′", "group size at which the mean baseline's variance (interpolated log–log over "
         "the measured N) equals OTB's; > max N: beyond the measured range"),
        ("saving", "1 − N/N′: share of sampled tokens saved for the same variance (a lower "
         "bound when N′ is beyond the range)"),
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
    proxies = run.record["proxies"]
    if proxies and all(
        isinstance(v, dict) and "proxy2_total_power" not in v for v in proxies.values()
    ):
        proxies = proxies[max(proxies)]  # several checkpoints: the last step's
    columns = ["proxy2_total_power", "expected_a_squared", "expected_w", "token_total_power"]
    rows = [[b] + [_number(p.get(c)) for c in columns] for b, p in proxies.items()]
    return html.table(
        ["baseline", *columns], rows, caption=f"Variance proxies per baseline ({run.label})"
    ) + html.definitions(
        [
            ("proxy2_total_power", "verl's mean_i Ā_i² · W(τ_i), Ā_i the masked mean "
             "advantage of response i (theory.md §4)"),
            ("expected_a_squared", "mean_i Ā_i²"),
            ("expected_w", "mean sequence energy W(τ) = Σ_t w_t"),
            ("token_total_power", "mean over responses of Σ_t mask·w_t·A_t²: the proxy "
             "variance the token-level baselines minimise (lower is better)"),
        ]
    )  # fmt: skip


def dynamics_tables(run: Run) -> str:
    header = ["run", "source", "baseline", "N", "steps", "collapse", "warning", "lead"]
    header += ["tokens to target", "variance proxy"]
    rows = [
        [r["run"], r["source"], r["baseline"], r["group_size"]]
        + [f"{r['first_step']}–{r['last_step']}", r["collapse_step"], r["warning_step"]]
        + [r["lead_steps"], _number(r["tokens_to_target"], "{:.3g}"), r["variance_proxy_kind"]]
        for r in run.record.get("runs", [])
    ]
    return html.table(header, rows, caption=f"Collapse per run ({run.label})") + html.definitions(
        [
            ("collapse", "training step where the rule's gradient-norm surge starts (— none)"),
            ("warning", "step where the variance proxy first rose above its trailing baseline "
             "before the collapse"),
            ("lead", "collapse − warning, in training steps"),
            ("rule", run.record.get("rule", {}).get("description", "")),
        ]
    ) + _live_table(run)  # fmt: skip


def _live_table(run: Run) -> str:
    """The live diagnostics' last logged values per run (docs/live.md), when a run has them."""
    live = [r for r in run.record.get("runs", []) if r.get("otb")]
    if not live:
        return ""
    names = sorted({k for r in live for k in r["otb"]})
    rows = [[name] + [_number(r["otb"].get(name)) for r in live] for name in names]
    caption = f"Live OTB diagnostics, last logged step ({run.label}); meanings: docs/live.md"
    return html.table(["metric", *(r["run"] for r in live)], rows, caption=caption)


def train_tables(run: Run) -> str:
    early, late, k = run.record["early"], run.record["late"], run.record["window"]
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
