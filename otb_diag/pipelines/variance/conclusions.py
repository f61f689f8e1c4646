"""What `otb-diag variance-compare` concludes, read off its tables: the headline (OTB
against the mean baseline per mode and N), the verdict on the paper's claim, the knee and the
recommendation (`maths/noise/knee.py`), as the records of `results/variance.py`; and the
fidelity rows and full-mode record of each checkpoint's measurements."""

from __future__ import annotations

import math
from dataclasses import fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd

from otb_diag.io.atomic import write_with
from otb_diag.maths import interval_verdict
from otb_diag.maths.variance.fidelity import fidelity
from otb_diag.maths.variance.intervals import REFERENCE
from otb_diag.pipelines.results.variance import (
    CLAIM_EQUIVALENT_N,
    CLAIM_N,
    HIGH,
    LOW,
    PAPER_TOKEN_SAVING,
    ClaimEvidence,
    ClaimVerdict,
    HeadlineRow,
    Knee,
    KneeRow,
    equivalent_interval,
    n_bound,
    n_end,
    percent,
    saving_end,
    saving_interval,
    saving_words,
)
from otb_diag.pipelines.variance.evidence import mode_intervals
from otb_diag.pipelines.variance.settings import VarianceSettings
from otb_diag.plots.figure_data import VarianceFigures
from otb_diag.plots.registry import save_figures

if TYPE_CHECKING:
    from torch import Tensor

    from otb_diag.policy.scores.token_scores import TokenScores


def knee_rows(noise: pd.DataFrame) -> Knee:
    """summary.json's `knee`: the split and the knee per baseline and N in the most exact mode
    with a signal (proxy alone: the split only), for the first aggregation."""
    modes = [m for m in ("full", "head", "proxy") if (noise["mode"] == m).any()]
    rows = noise[noise["mode"] == modes[0]]
    rows = rows[rows["aggregation"] == rows["aggregation"].iloc[0]]
    names = [f.name for f in fields(KneeRow)]
    return Knee(
        mode=modes[0],
        aggregation=str(rows["aggregation"].iloc[0]),
        rows=[KneeRow(**{f: _plain(r[f]) for f in names}) for _, r in rows.iterrows()],
    )


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
        data = VarianceFigures(noise_rows=rows, noise_aggregation=str(rows["aggregation"].iloc[0]))
        files += save_figures("variance-compare", data, out, mode)
    return files


def headline(variance: pd.DataFrame, sketch_dim: int) -> list[HeadlineRow]:
    """The paper's comparison, read off the table: OTB's equivalent mean-baseline group size per
    mode and N (first aggregation, last checkpoint), with the ratio to the mean baseline and to
    RLOO, each with the 95 % interval every reading of the table uses
    (`pipelines/variance/evidence.py`; `sketch_dim`: the projections' k), and whether OTB's
    variance is below mean's. A mode whose mean baseline has no positive variance at some N
    (no group's rewards differ in its draws) has no row: nothing to compare there."""
    rows = []
    aggregation = variance["aggregation"].iloc[0]
    for mode, frame in variance.groupby("mode", sort=False):
        if "step" in frame:
            frame = frame[frame["step"] == frame["step"].max()]
        frame = frame[frame["aggregation"] == aggregation]
        if not (frame.loc[frame["baseline"] == REFERENCE, "variance"] > 0).all():
            continue
        frame = mode_intervals(frame, str(mode), sketch_dim)
        otb = frame[frame["baseline"] == "otb"].set_index("group_size")
        rloo = frame[frame["baseline"] == "rloo"].set_index("group_size")["variance"]
        for n, row in otb.iterrows():
            ratio_low = float(row["ratio_to_mean_low"])
            ratio_high = float(row["ratio_to_mean_high"])
            rows.append(
                HeadlineRow(
                    mode=str(mode),
                    aggregation=str(aggregation),
                    group_size=int(n),
                    otb_ratio_to_mean=float(row["ratio_to_mean"]),
                    otb_ratio_to_mean_low=ratio_low,
                    otb_ratio_to_mean_high=ratio_high,
                    otb_ratio_to_rloo=float(row["variance"] / rloo[n])
                    if n in rloo and rloo[n] > 0
                    else None,
                    equivalent_mean_group_size=float(row["equivalent_mean_group_size"]),
                    equivalent_range=str(row["equivalent_range"]),
                    equivalent_low=float(row["equivalent_mean_group_size_low"]),
                    equivalent_low_range=str(row["equivalent_low_range"]),
                    equivalent_high=float(row["equivalent_mean_group_size_high"]),
                    equivalent_high_range=str(row["equivalent_high_range"]),
                    token_savings=float(row["token_savings"]),
                    token_savings_low=float(row["token_savings_low"]),
                    token_savings_high=float(row["token_savings_high"]),
                    otb_below_mean=interval_verdict.below(ratio_low, ratio_high, 1.0),
                )
            )
    return rows


def verdicts(
    variance: pd.DataFrame, settings: VarianceSettings
) -> tuple[list[HeadlineRow], list[ClaimVerdict]]:
    """The headline rows (`headline`) and the paper-claim verdicts read off them
    (`paper_claim`) of the table `variance`, measured with `settings`."""
    rows = headline(variance, settings.sketch_dim)
    return rows, paper_claim(rows, list(settings.modes), int(variance["group_size"].max()))


def paper_claim(rows: list[HeadlineRow], modes: list[str], max_n: int) -> list[ClaimVerdict]:
    """Per measured mode, the paper's headline read off its `headline` row at N = 4 (`max_n`:
    the largest N measured), by `claim_verdict`; a mode without rows (no positive variance)
    reads "no signal". No N = 4 measured (pools smaller than 8, or N = 4 not requested) gives
    no verdict."""
    if not any(h.group_size == CLAIM_N for h in rows) and rows:
        return []
    at_claim = {h.mode: h for h in rows if h.group_size == CLAIM_N}
    measured = {h.mode for h in rows}
    return [
        claim_verdict(mode, at_claim.get(mode), max_n)
        for mode in modes
        if mode in at_claim or mode not in measured
    ]


def claim_verdict(mode: str, evidence: ClaimEvidence | None, max_n: int) -> ClaimVerdict:
    """The paper's headline in one mode at equal gradient variance, from OTB's N′ at N = 4 and
    its 95 % interval (`evidence`: a headline row, or a verdict read back; None where the
    rewards gave nothing to compare) and the saving `1 − 4/N′` (`max_n`: the largest N
    measured). Two readings, each a verdict read off N′'s interval
    (`maths/interval_verdict.py`): "> 65 % fewer tokens" at equal variance (N′ ≥ 4/0.35), and
    "N = 4 ≈ N = 32" (N′ ≥ 32). An end of the interval beyond the measured N says only N′ >
    `max_n`: such an interval cannot exclude N′ ≥ 32 when `max_n` < 32 (the pools cannot show
    it), and an end below says only N′ ≤ the smallest N. The text names the paper's own
    number beside it, > 65 % fewer tokens at equal score over training: a different quantity,
    not measured here."""
    if evidence is None:
        return ClaimVerdict.no_signal(mode)
    e = evidence
    low = n_end(e.equivalent_low, e.equivalent_low_range, max_n, LOW)
    high = n_end(e.equivalent_high, e.equivalent_high_range, max_n, HIGH)
    saving_verdict = interval_verdict.at_least(  # the saving's interval, as printed
        saving_end(e.token_savings_low, e.equivalent_low_range, LOW),
        saving_end(e.token_savings_high, e.equivalent_high_range, HIGH),
        PAPER_TOKEN_SAVING,
    )
    verdict = interval_verdict.at_least(low, high, CLAIM_EQUIVALENT_N)
    if verdict == interval_verdict.NOT_RESOLVED and max_n < CLAIM_EQUIVALENT_N:
        why = (  # the interval reaches past the largest N the pools show
            f"N′ up to {max_n} can be measured here; N′ ≥ {CLAIM_EQUIVALENT_N} needs "
            f"N = {CLAIM_EQUIVALENT_N} measured, pools of M ≥ {2 * CLAIM_EQUIVALENT_N}"
        )
    else:
        why = _why(verdict, f"N′ = {CLAIM_EQUIVALENT_N}")
    equiv, where = e.equivalent_mean_group_size, e.equivalent_range
    matched = {"beyond": f"N′ > {max_n}", "below": f"N′ ≤ {n_bound(equiv, None, max_n)}"}.get(
        where or "", f"N′ = {n_bound(equiv, None, max_n)}"
    )
    saving = e.token_savings if e.token_savings is not None else math.nan
    text = (
        f"at equal gradient variance, OTB at N = {CLAIM_N} matches mean at {matched} "
        f"({equivalent_interval(e, max_n)}), {saving_words(saving, where)} "
        f"({saving_interval(e)}); "
        f"> {percent(PAPER_TOKEN_SAVING)} fewer tokens at equal variance: {saving_verdict} "
        f"({_why(saving_verdict, percent(PAPER_TOKEN_SAVING))}; the paper's > "
        f"{percent(PAPER_TOKEN_SAVING)} is at equal score over training, a different "
        f"quantity); N = {CLAIM_N} ≈ N = {CLAIM_EQUIVALENT_N} at equal variance: {verdict} "
        f"({why})"
    )
    return ClaimVerdict(
        mode=mode,
        equivalent_mean_group_size=equiv,
        equivalent_range=where,
        equivalent_low=e.equivalent_low,
        equivalent_low_range=e.equivalent_low_range,
        equivalent_high=e.equivalent_high,
        equivalent_high_range=e.equivalent_high_range,
        token_savings=e.token_savings,
        token_savings_low=e.token_savings_low,
        token_savings_high=e.token_savings_high,
        saving_verdict=saving_verdict,
        verdict=verdict,
        text=text,
    )


def _why(verdict: str, line: str) -> str:
    """Where the interval lies against the claim's `line`."""
    return {
        interval_verdict.HOLDS: f"the interval lies at or above {line}",
        interval_verdict.FAILS: f"the interval lies below {line}",
    }.get(verdict, f"the interval reaches {line}")


def fidelity_rows(
    step: int, mode: str, w: Tensor, measured: TokenScores, mask: Tensor
) -> list[dict[str, Any]]:
    """fidelity.csv rows: the whole parameter vector (`block` = all), then each block of a
    split full-mode projection, `w_t` against the block's per-token `‖s_{t,b}‖²`."""
    rows = [{"step": step, "mode": mode, "block": "all", **fidelity(w, measured.sq_norm, mask)}]
    if measured.block_sq_norm is not None and len(measured.blocks) > 1:
        rows += [
            {
                "step": step,
                "mode": mode,
                "block": name,
                **fidelity(w, measured.block_sq_norm[..., b], mask),
            }
            for b, (name, _, _) in enumerate(measured.blocks)
        ]
    return rows


def full_record(measured: TokenScores, jl_error: dict[str, float]) -> dict[str, Any]:
    """summary.json's account of a full-mode measurement: engine, where `‖s_t‖²` (the `-true`
    rows) and the sequence's `‖Σ_t s_t‖²` (the `-seqnorm-true` rows) came from, the cost
    estimate, the blocks and the measured projection error."""
    return {
        "engine": measured.engine,
        "sq_norm": "exact (reverse mode)"
        if measured.sq_norm_exact
        else "JL estimate ‖u_t‖² (forward mode; unbiased, relative error ≈ √(2/k) per token)",
        "sequence_sq_norm": (
            "Σ_t ‖s_t‖² exact plus the cross terms s_t·s_t' estimated from the k projections"
            if measured.sq_norm_exact
            else "JL estimate ‖Σ_t u_t‖² (forward mode; unbiased)"
        ),
        "plan": measured.plan,
        "blocks": [{"block": name, "offset": o, "k": k} for name, o, k in measured.blocks],
        "jl_error": jl_error,
    }
