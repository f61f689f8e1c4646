"""What `otb-diag variance-compare` concludes and prints, read off its tables: the headline (OTB
against the mean baseline per mode and N), the verdict on the paper's claim, the knee and the
recommendation (`maths/variance/knee.py`), and the text summary."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd

from otb_diag.io.atomic import write_with
from otb_diag.plots import variance as plots_variance
from otb_diag.plots.style import save_figure

KNEE_FIELDS = (
    "baseline", "group_size", "within_share", "within_share_low", "within_share_high",
    "noise_scale", "noise_scale_low", "noise_scale_high", "noise_scale_tokens",
    "noise_scale_tokens_low", "noise_scale_tokens_high", "snr", "grad_sq_resolved",
)  # fmt: skip


def knee_rows(noise: pd.DataFrame) -> dict[str, Any]:
    """summary.json's `knee`: the split and the knee per baseline and N in the most exact mode
    with a signal (proxy alone: the split only), for the first aggregation."""
    modes = [m for m in ("full", "head", "proxy") if (noise["mode"] == m).any()]
    rows = noise[noise["mode"] == modes[0]]
    rows = rows[rows["aggregation"] == rows["aggregation"].iloc[0]]
    return {
        "mode": modes[0],
        "aggregation": str(rows["aggregation"].iloc[0]),
        "rows": [{f: _plain(r[f]) for f in KNEE_FIELDS} for _, r in rows.iterrows()],
    }


def _plain(x: Any) -> Any:
    """A JSON-ready scalar (numpy types to Python; inf and NaN stay floats)."""
    return x.item() if hasattr(x, "item") else x


def write_noise(out: Path, noise: pd.DataFrame, last: pd.DataFrame) -> list[str]:
    """noise_scale.csv (every mode, aggregation, baseline, N and checkpoint) and the figure of
    tokens per step at the knee against N (`last`: the last checkpoint's rows), in `out`."""
    write_with(out / "noise_scale.csv", lambda p: noise.to_csv(p, index=False))
    files = ["noise_scale.csv"]
    signal = last[last["mode"] != "proxy"]
    if not signal.empty:
        mode = "full" if (signal["mode"] == "full").any() else "head"
        rows = signal[signal["mode"] == mode]
        fig = plots_variance.fig_knee_tokens(rows, aggregation=str(rows["aggregation"].iloc[0]))
        files += [p.name for p in save_figure(fig, out, f"knee_tokens_{mode}")]
    return files


def headline(variance: pd.DataFrame) -> list[dict[str, Any]]:
    """The paper's comparison, read off the table: OTB's equivalent mean-baseline group size per
    mode and N (first aggregation), with the ratio to the mean baseline and to RLOO."""
    rows = []
    for (mode, agg), frame in variance.groupby(["mode", "aggregation"], sort=False):
        if agg != variance["aggregation"].iloc[0]:
            continue
        if "step" in frame:
            frame = frame[frame["step"] == frame["step"].max()]
        otb = frame[frame["baseline"] == "otb"].set_index("group_size")
        rloo = frame[frame["baseline"] == "rloo"].set_index("group_size")["variance"]
        for n, row in otb.iterrows():
            rows.append(
                {
                    "mode": mode,
                    "aggregation": agg,
                    "group_size": int(n),
                    "otb_ratio_to_mean": float(row["ratio_to_mean"]),
                    "otb_ratio_to_rloo": float(row["variance"] / rloo[n]) if n in rloo else None,
                    "equivalent_mean_group_size": float(row["equivalent_mean_group_size"]),
                    "equivalent_range": row.get("equivalent_range"),
                    "token_savings": float(row["token_savings"]),
                }
            )
    return rows


# The paper's claim: OTB with 4 responses per prompt matches the group-mean baseline with 32.
CLAIM_N, CLAIM_EQUIVALENT_N = 4, 32


def paper_claim(rows: list[dict[str, Any]], max_n: int) -> list[dict[str, Any]]:
    """Per mode, whether this run reproduces "OTB at N = 4 ≈ mean at N = 32", read off the
    `headline` rows at N = 4 (`max_n`: the largest N measured): `reproduced` (mean-equivalent
    N′ ≥ 32), `not reproduced` (N′ < 32, measured), or `undecided` (N′ beyond `max_n` < 32).
    No row at N = 4 (pools smaller than 8, or N = 4 not requested) gives no verdict."""
    verdicts = []
    for h in rows:
        if h["group_size"] != CLAIM_N:
            continue
        equiv = h["equivalent_mean_group_size"]  # inf when beyond the measured range
        if h["equivalent_range"] == "beyond" and max_n < CLAIM_EQUIVALENT_N:
            verdict = "undecided"
            text = (
                f"OTB at N={CLAIM_N} beats the mean baseline at every measured N (up to "
                f"{max_n}); pools of M ≥ {2 * CLAIM_EQUIVALENT_N} are needed to reach "
                f"N = {CLAIM_EQUIVALENT_N}"
            )
        elif equiv >= CLAIM_EQUIVALENT_N:
            verdict = "reproduced"
            text = f"OTB at N={CLAIM_N} matches the mean baseline at N′ ≥ {CLAIM_EQUIVALENT_N}"
        else:
            verdict = "not reproduced"
            text = (
                f"OTB at N={CLAIM_N} matches the mean baseline at N′ ≈ {equiv:.1f}, not "
                f"{CLAIM_EQUIVALENT_N} ({equiv / CLAIM_N:.1f}× fewer tokens, paper "
                f"{CLAIM_EQUIVALENT_N // CLAIM_N}×)"
            )
        verdicts.append({"mode": h["mode"], "verdict": verdict, "text": text})
    return verdicts


def format_summary(summary: dict[str, Any]) -> str:
    """The short human summary `otb-diag variance-compare` prints: the headline, plainly."""
    lines = [
        f"{'mode':<6} {'N':>3} {'OTB/mean':>9} {'OTB/RLOO':>9} {'mean-equivalent N':>18}"
        f" {'token saving':>13}"
    ]
    bound = {"beyond": "≥", "below": "≤"}  # savings are bounds outside the measured N
    max_n = max(h["group_size"] for h in summary["headline"])  # requested N are capped at M/2
    for h in summary["headline"]:
        equiv, where = h["equivalent_mean_group_size"], h["equivalent_range"]
        shown = f"> {max_n}" if where == "beyond" else (f"{equiv:.1f}")
        ratio_rloo = h["otb_ratio_to_rloo"]
        saving = f"{bound.get(where, '')}{h['token_savings']:.0%}"
        lines.append(
            f"{h['mode']:<6} {h['group_size']:>3} {h['otb_ratio_to_mean']:>9.3f} "
            f"{(f'{ratio_rloo:.3f}' if ratio_rloo is not None else '-'):>9} {shown:>18} "
            f"{saving:>13}"
        )
    lines.append("")
    lines.append(
        "OTB/mean < 1 means OTB has lower variance than the group mean at the same N; "
        "the mean-equivalent N is the group size at which the mean baseline would "
        "reach OTB's variance (log-log interpolation over the measured N)."
    )
    for c in summary["paper_claim"]:
        lines.append(
            f"paper's claim (OTB N={CLAIM_N} ≈ mean N={CLAIM_EQUIVALENT_N}), {c['mode']}: "
            f"{c['verdict']}: {c['text']}."
        )
    lines += _knee_lines(summary)
    for step, full in summary.get("full", {}).items():
        err = full["jl_error"]
        lines.append(
            f"full mode (step {step}): engine {full['engine']}, per-token ‖s_t‖² {full['sq_norm']}"
        )
        if err:
            lines.append(
                f"projection error (k={err['k']}, measured over {err['subsketches']} "
                f"sub-sketches): variances ±{err['variance_relative_error']:.1%} (worst case "
                f"√(2/k) = {err['theory_worst_case']:.1%}), ratios to mean "
                f"±{err['ratio_relative_error']:.1%}"
            )
    for f in summary["fidelity"]:
        if f.get("block", "all") != "all":
            continue
        lines.append(
            f"proxy fidelity ({f['mode']}, step {f['step']}): Spearman "
            f"{f['token_spearman']:.3f}, Pearson {f['token_pearson']:.3f} over "
            f"{f['tokens']} tokens"
        )
    lines.append(f"wrote {len(summary['outputs'])} files to {summary['out']}")
    return "\n".join(lines)


def _interval(low: float, high: float, scale: float = 1.0, fmt: str = ".3g") -> str:
    def one(x: float) -> str:
        return "∞" if x == float("inf") else format(x / scale, fmt)

    return f"[{one(low)}, {one(high)}]"


def _knee_lines(summary: dict[str, Any]) -> list[str]:
    """The split and the knee per baseline and N, then the recommendation."""
    knee = summary.get("knee")
    if not knee:
        return []
    lines = [
        "",
        f"noise of a step ({knee['mode']} mode, {knee['aggregation']}): the within-prompt share "
        "and the knee (prompts, k tokens a step at the noise scale), with 95 % intervals",
    ]
    lines.append(
        f"{'baseline':<12} {'N':>3} {'within':>22} {'knee prompts':>24} {'knee k tokens':>26}"
    )
    for r in knee["rows"]:
        share = f"{r['within_share']:.0%} " + _interval(
            100 * r["within_share_low"], 100 * r["within_share_high"], fmt=".0f"
        )
        if knee["mode"] == "proxy":
            prompts = tokens = "-"
        elif not r["grad_sq_resolved"]:  # only a lower bound: |G|² may be 0
            prompts = f"≥ {r['noise_scale_low']:.3g} (|G|² ~ 0)"
            tokens = f"≥ {r['noise_scale_tokens_low'] / 1e3:.3g} (|G|² ~ 0)"
        else:
            prompts = f"{r['noise_scale']:.3g} " + _interval(
                r["noise_scale_low"], r["noise_scale_high"]
            )
            tokens = f"{r['noise_scale_tokens'] / 1e3:.3g} " + _interval(
                r["noise_scale_tokens_low"], r["noise_scale_tokens_high"], scale=1e3
            )
        lines.append(
            f"{r['baseline']:<12} {r['group_size']:>3} {share:>22} {prompts:>24} {tokens:>26}"
        )
    if knee["mode"] == "proxy":
        lines.append("proxy scores are noise independent of the reward: |G|² = 0, no knee.")
    if any(r["within_share"] > 1 for r in knee["rows"]):
        lines.append(
            "a within share above 100 % means the between-prompt estimate came out below 0 "
            "(its noise corrections exceed the measured spread): no between-prompt spread is "
            "measurable there."
        )
    lines.append(f"recommendation: {summary['noise_scale']['text']}")
    return lines
