"""The knee of every (mode, aggregation, baseline, N) and the recommendation read off them
(docs/theory.md §4.1): the noise scale in prompts, responses and tokens per step, and the
(baseline, N) that reaches the knee with the fewest tokens a step.

`noise_table` turns the paired draws into one row per (aggregation, baseline, N) with the
estimates of `noise_scale.py` and their intervals; `recommend` picks the cheapest knee whose
`|G|²` is resolved from zero, beside the `mean` baseline at the group size the user trains with,
and says whether it is cheaper than mean's by the two intervals, not by the point estimates
(`cheaper_verdict`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import pandas as pd

from otb_diag.maths.estimators.registry import TRUE_SUFFIX
from otb_diag.maths.interval_verdict import FAILS, HOLDS, NO_SIGNAL, NOT_RESOLVED, below_interval
from otb_diag.maths.noise.noise_scale import FEW_PROMPTS, PromptMoments, noise_estimates
from otb_diag.maths.variance.paired_draws import PROXY, PairedDraws

KNEE_COLUMNS = ("noise_scale", "noise_scale_responses", "noise_scale_tokens", "snr", "grad_sq")
PREFERRED_MODES = ("full", "head")  # modes with a real signal, the most exact first
REFERENCE = "mean"


def noise_table(
    paired: PairedDraws, mean_tokens: float, prompts_per_step: int | None = None
) -> pd.DataFrame:
    """One row per (aggregation, baseline label, N) of `paired`: the estimates and intervals of
    `noise_scale.noise_estimates`, with the knee in responses (`B·N`) and tokens (`B·N·L̄`,
    `mean_tokens` = L̄). In `proxy` mode the scores carry no signal (`|G|² = 0` by
    construction): its knee columns are NaN and `grad_sq_resolved` False."""
    mode = paired.metadata["mode"]
    records = []
    for agg in paired.aggregations:
        for spec in paired.specs:
            for n, (estimates, _, _) in paired.per_size.items():
                drawn = estimates[agg, spec.label]
                moments = PromptMoments(
                    drawn.prompt_sums, drawn.prompt_squares, paired.pool_sizes, paired.draws, n
                )
                row = noise_estimates(moments, prompts_per_step)
                for end in ("", "_low", "_high"):
                    b = row[f"noise_scale{end}"]
                    row[f"noise_scale_responses{end}"] = b * n  # B·N
                    row[f"noise_scale_tokens{end}"] = b * n * mean_tokens  # B·N·L̄
                if mode == PROXY:
                    for name in KNEE_COLUMNS:
                        for end in ("", "_low", "_high"):
                            row[f"{name}{end}"] = math.nan
                    row["grad_sq_resolved"] = False
                records.append(
                    {
                        "mode": mode,
                        "aggregation": agg,
                        "baseline": spec.label,
                        "group_size": n,
                        **row,
                        "prompts": paired.prompts,
                        "mean_response_tokens": mean_tokens,
                    }
                )
    return pd.DataFrame(records)


def recommend(table: pd.DataFrame, current_n: int) -> dict[str, Any]:
    """The (baseline, N) with the fewest tokens per step at the knee, among rows whose `|G|²`
    interval lies above 0, in the most exact mode with a signal and the table's first
    aggregation; beside `mean` at `current_n` (the nearest measured N when it was not measured)
    and the share of the noise that no baseline can remove there (the between-prompt spread).
    `-true` rows (energies no trainer has) are not candidates. `claim` is None, and the text
    says why, when no knee is resolved. The text is `recommendation_text` of the rest."""
    modes = [m for m in PREFERRED_MODES if (table["mode"] == m).any()]
    if not modes:
        out: dict[str, Any] = {"mode": None, "claim": None}
        return {**out, "text": recommendation_text(out)}
    mode = modes[0]
    rows = table[table["mode"] == mode]
    rows = rows[rows["aggregation"] == rows["aggregation"].iloc[0]]
    sizes = sorted(rows["group_size"].unique())
    n_ref = int(min(sizes, key=lambda n: (abs(n - current_n), n)))
    ref = rows[(rows["baseline"] == REFERENCE) & (rows["group_size"] == n_ref)]
    candidates = rows[rows["grad_sq_resolved"] & ~rows["baseline"].str.endswith(TRUE_SUFFIX)]
    prompts = int(rows["prompts"].iloc[0])
    out = {
        "mode": mode,
        "aggregation": str(rows["aggregation"].iloc[0]),
        "current_n": current_n,
        "reference_n": n_ref,
        "prompts": prompts,
        "few_prompts": prompts < FEW_PROMPTS,
        "claim": None,
    }
    if not candidates.empty:
        best = candidates.loc[candidates["noise_scale_tokens"].idxmin()]
        out["claim"] = {
            "baseline": str(best["baseline"]),
            "group_size": int(best["group_size"]),
            **{c: float(best[c]) for c in _KNEE_NUMBERS},
        }
    if not ref.empty:
        r = ref.iloc[0]
        out["reference"] = {
            "baseline": REFERENCE,
            "group_size": n_ref,
            "resolved": bool(r["grad_sq_resolved"]),
            "noise_scale_tokens": float(r["noise_scale_tokens"]),
            "noise_scale_low": float(r["noise_scale_low"]),
            "between_share": 1 - float(r["within_share"]),
            "noise_scale": float(r["noise_scale"]),
            "noise_scale_tokens_low": float(r["noise_scale_tokens_low"]),
            "noise_scale_tokens_high": float(r["noise_scale_tokens_high"]),
        }
        out["verdict"] = cheaper_verdict(out["claim"], out["reference"])
    return {**out, "text": recommendation_text(out)}


def no_signal() -> dict[str, Any]:
    """The recommendation of a run whose rewards carry no signal: nothing was measured."""
    out: dict[str, Any] = {"mode": None, "claim": None, "verdict": NO_SIGNAL}
    return {**out, "text": recommendation_text(out)}


def cheaper_verdict(claim: Mapping[str, Any] | None, ref: Mapping[str, Any]) -> str | None:
    """The verdict on "the knee claimed costs fewer tokens a step than mean's at the reference
    N", read off both 95 % intervals of the tokens at the knee (`interval_verdict.below_interval`;
    mean's knee unresolved: only its low end, the interval open above). None where no such
    comparison is stated: no knee claimed, or the knee claimed is mean's at that N itself."""
    if claim is None or (
        claim["baseline"] == ref["baseline"] and claim["group_size"] == ref["group_size"]
    ):
        return None
    ref_high = ref["noise_scale_tokens_high"] if ref["resolved"] else math.inf
    return below_interval(
        (_number(claim["noise_scale_tokens_low"]), _number(claim["noise_scale_tokens_high"])),
        (_number(ref["noise_scale_tokens_low"]), _number(ref_high)),
    )


# The numbers a knee's sentence reads (`_knee_text`), besides its baseline and N.
_KNEE_NUMBERS = (
    "noise_scale",
    "noise_scale_tokens",
    "noise_scale_tokens_low",
    "noise_scale_tokens_high",
)


def recommendation_text(advice: Mapping[str, Any]) -> str:
    """The recommendation's sentence from its record's fields alone (`recommend`'s, or a
    summary.json's or figures.json's `noise_scale` as read back, where a non-finite number is
    null, `_number`): the knee claimed or why none is, `mean` at the reference N beside it and
    the verdict comparing the two (`cheaper_verdict`), the between-prompt share no baseline can
    remove, and the caveats (N not measured, few prompts); or, where the rewards carried no
    signal (`no_signal`), that no knee can be measured."""
    mode = advice["mode"]
    if advice.get("verdict") == NO_SIGNAL:
        return (
            "no knee: the rewards carry no signal (each group's rewards are equal), so no "
            "mean gradient |G|² can be measured"
        )
    if mode is None:
        return (
            "no knee: proxy scores carry no signal (|G|² = 0 by construction); "
            "run with --mode head or full"
        )
    claim, ref, n_ref = advice["claim"], advice.get("reference"), advice["reference_n"]
    parts = []
    if claim is None:
        parts.append(
            f"{mode} mode: |G|² is not resolved from zero for any baseline and N (its 95 % "
            "interval reaches 0), so no knee is claimed"
        )
    else:
        parts.append(_knee_text(claim))
    if ref is not None:
        if ref["resolved"]:
            parts.append(_knee_text(ref))
        verdict = advice.get("verdict")
        if verdict is not None:
            parts.append(
                f"the knee claimed costs fewer tokens a step than {REFERENCE}'s at N = {n_ref}: "
                f"{verdict} ({_CHEAPER_WHY[verdict]})"
            )
        else:
            at_least = _number(ref["noise_scale_low"])
            parts.append(
                f"{REFERENCE} at N = {n_ref}: |G|² not resolved from zero, so no knee "
                + (
                    f"(at least {at_least:.3g} prompts)"
                    if math.isfinite(at_least)
                    else "(no signal measurable at all: |G|² ≤ 0 across its interval)"
                )
            )
        between = _number(ref["between_share"])
        if math.isfinite(between) and between > 0:
            parts.append(
                f"between-prompt spread is {between:.0%} of {REFERENCE}'s noise at N = {n_ref}, "
                f"so no baseline can cut its knee by more than {1 - between:.0%}"
            )
        elif math.isfinite(between):  # the noise corrections exceed the measured spread
            parts.append(
                f"no between-prompt spread is measurable in {REFERENCE}'s noise at N = {n_ref} "
                "(its estimate is below 0), so a baseline could act on all of it"
            )
    if n_ref != advice["current_n"]:
        parts.append(f"N = {advice['current_n']} was not measured; compared at N = {n_ref}")
    if advice["few_prompts"]:
        parts.append(
            f"only {advice['prompts']} prompts: the between-prompt terms and |G|² rest on them, "
            f"so their intervals are wide (use ≥ {FEW_PROMPTS})"
        )
    return "; ".join(parts) + "."


# Why the comparison of two knees reads as it does (`cheaper_verdict`).
_CHEAPER_WHY = {
    HOLDS: "its tokens' interval lies below mean's",
    FAILS: "its tokens' interval lies at or above mean's",
    NOT_RESOLVED: "the two tokens' intervals overlap",
}


def _knee_text(knee: Mapping[str, Any]) -> str:
    """One knee in words: a record with `baseline`, `group_size` and `_KNEE_NUMBERS`."""
    scale, tokens, low, high = (_number(knee[c]) for c in _KNEE_NUMBERS)
    return (
        f"{knee['baseline']} at N = {int(knee['group_size'])}: knee at ~{scale:.3g} prompts "
        f"({tokens / 1e3:.3g} k tokens a step; 95 % {_bound(low / 1e3)}–{_bound(high / 1e3)} k)"
    )


def _number(x: float | None) -> float:
    """A number of a recommendation's record: null (how a JSON file holds a non-finite number,
    `io/atomic.py:json_text`; here an unbounded interval) reads as inf."""
    return math.inf if x is None else float(x)


def _bound(x: float) -> str:
    return "∞" if math.isinf(x) else f"{x:.3g}"
