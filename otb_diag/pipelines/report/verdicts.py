"""The sentences the report opens with: one per finding, each with its number and, where the
run measured one, its 95 % interval. Read from the files the commands wrote; nothing is
re-measured here.

- variance-compare: first the recommendation of prompts and responses per step (the knee of the
  gradient noise scale, `maths/noise/knee.py:recommend`, in summary.json's `noise_scale`),
  then whether the rewards carry a signal (when not every group's does), OTB's
  mean-equivalent group size N′ and token saving `1 − N/N′` per mode, with the intervals
  summary.json holds (the ones `otb-diag regress` uses, `pipelines/variance/evidence.py`: the
  bootstrap interval of the variance widened for the seeded projection, propagated through the
  mean-baseline curve) and the verdicts read off them, and the paper-claim verdicts of
  summary.json (its two readings: the saving at equal gradient variance, and the paper's at
  equal score over training; "no signal" where the rewards carried none);
- proxy fidelity (fidelity.csv, per block when it has a `block` column);
- a training log's split pooled over its steps: the knee at its last split step, or the honest
  bound (collapse.json's `budget`, `pipelines/pooled_budget.py`); these lead the report;
- collapse step, warning and lead time per run (collapse.json);
- energy heterogeneity (summary.json) and a training run's early/late reward (train.json).
"""

from __future__ import annotations

import pandas as pd

from otb_diag.pipelines.results.dynamics import DynamicsResult
from otb_diag.pipelines.results.energy import EnergyResult, zero_tail_note
from otb_diag.pipelines.results.report import Verdict
from otb_diag.pipelines.results.train import TrainResult
from otb_diag.pipelines.results.variance import (
    CLAIM_N,
    VarianceResult,
    equivalent_interval,
    interval_end,
    saving_interval,
    saving_words,
)

MODES = ("proxy", "head", "full")
MODE_NAMES = {
    "proxy": "synthetic scores with ‖s_t‖² = w_t",
    "head": "exact output-layer gradients",
    "full": "exact gradients of every parameter",
}


def _interval(low: float | None, high: float | None, fmt: str) -> str:
    """`low`–`high`, an infinite end (None in summary.json) as ∞."""
    return f"95 % interval {interval_end(low, fmt)}–{interval_end(high, fmt)}"


def budget_verdict(result: VarianceResult, label: str) -> list[Verdict]:
    """The recommendation sentence of summary.json's `noise_scale`."""
    sentence = f"{result.recommendation} ({result.recommendation_where})."
    return [Verdict(f"prompts and responses per step ({label})", sentence)]


def pooled_budget_verdicts(result: DynamicsResult, label: str) -> list[Verdict]:
    """One sentence per run and estimator whose log held the split: the pooled knee at the
    last split step under that estimator, or its bound (`pooling.Pooled.sentence`)."""
    return [
        Verdict(f"prompts per step over training ({label}: {r.run})", b.sentence[0].upper() +
                b.sentence[1:] + ".")
        for r in result.runs
        for b in r.budget or []
    ]  # fmt: skip


def variance_verdicts(result: VarianceResult, label: str) -> list[Verdict]:
    """Whether the rewards carry a signal (when not every group's does); per mode, OTB at N = 4
    (else the smallest N) against the `mean` baseline, each number with the 95 % interval
    summary.json holds beside it (`pipelines/variance/evidence.py`) and the verdict on OTB's
    variance below mean's; then the paper-claim verdicts."""
    verdicts = []
    signal = result.signal.sentence()
    if signal:
        verdicts.append(Verdict(f"reward signal ({label})", signal[0].upper() + signal[1:] + "."))
    rows = result.headline
    max_n = max((r.group_size for r in rows), default=0)  # measured: requested N ≤ M/2
    for mode in dict.fromkeys(r.mode for r in rows):
        mine = {r.group_size: r for r in rows if r.mode == mode}
        row = mine.get(CLAIM_N) or mine[min(mine)]
        n, agg = row.group_size, row.aggregation
        sentence = (
            f"With {MODE_NAMES.get(mode, mode)} ({mode} mode, {agg}), OTB at N = {n} has "
            f"{row.otb_ratio_to_mean:.3f}× the gradient variance of the mean baseline "
            f"({_interval(row.otb_ratio_to_mean_low, row.otb_ratio_to_mean_high, '.3f')}; "
            f"OTB below mean: {row.otb_below_mean}): the mean baseline needs "
            + (
                f"N′ ≈ {row.equivalent_mean_group_size:.1f} responses per prompt to match it"
                if row.equivalent_range != "beyond"
                else f"more than the {max_n} responses per prompt measured to match it"
            )
            + f" ({equivalent_interval(row, max_n)}), "
            f"{saving_words(row.token_savings, row.equivalent_range)} at equal variance "
            f"({saving_interval(row)})."
        )
        verdicts.append(Verdict(f"OTB vs mean, {mode} ({label})", sentence))
    for claim in result.paper_claim:
        sentence = f"In {claim.mode} mode, {claim.text}."  # both readings, each named
        verdicts.append(Verdict(f"paper's claim, {claim.mode} ({label})", sentence))
    return verdicts


def absent_modes(result: VarianceResult, label: str) -> list[str]:
    """What a variance run did not measure, said plainly."""
    modes = result.modes
    notes = []
    if "full" not in modes:
        notes.append(
            f"{label}: no full mode, so no variance with the exact gradients of every parameter "
            "and no otb-true/optseq-true (run variance-compare with --mode ...,full; it prints "
            "its cost estimate first and keeps within --budget)."
        )
    if not {"head", "full"} & set(modes):
        notes.append(
            f"{label}: no head or full mode, so no proxy fidelity (it needs true per-token "
            "gradient norms)."
        )
    return notes


def fidelity_verdicts(fidelity: pd.DataFrame, label: str) -> list[Verdict]:
    """One sentence per mode, checkpoint step and (when present) block of fidelity.csv."""
    verdicts = []
    for row in fidelity.to_dict("records"):
        where = [f"{row['mode']} mode"]
        if "step" in row and pd.notna(row["step"]):
            where.append(f"checkpoint step {int(row['step'])}")
        if "block" in row and pd.notna(row["block"]):
            where.append(f"block {row['block']}")
        sentence = (
            f"The proxy w_t tracks the true per-token ‖∇θ log p_t‖² ({', '.join(where)}) with "
            f"Spearman {row['token_spearman']:.3f} and Pearson {row['token_pearson']:.3f} over "
            f"{int(row['tokens']):,} tokens"
        )
        if "sequence_spearman" in row and pd.notna(row.get("sequence_spearman")):
            sentence += (
                f", and per response (summed energies) with Spearman "
                f"{row['sequence_spearman']:.3f}, Pearson {row['sequence_pearson']:.3f} over "
                f"{int(row['sequences']):,} responses"
            )
        sentence += " (no interval: the tokens of one response are not independent draws)."
        verdicts.append(Verdict(f"proxy fidelity ({label})", sentence))
    return verdicts


def collapse_verdicts(result: DynamicsResult, label: str) -> list[Verdict]:
    """One sentence per run of collapse.json."""
    rule = result.rule
    verdicts = []
    for r in result.runs:
        span = f"steps {r.first_step}–{r.last_step}, {r.points} logged points"
        if r.collapse_step is None:
            sentence = (
                f"Run {r.run} ({span}): no collapse detected (no {rule.persist} "
                f"consecutive points with robust z of log grad-norm above "
                f"{rule.threshold}), so no warning and no lead time."
            )
        else:
            z = r.collapse_z
            sentence = (
                f"Run {r.run} ({span}): collapse at step {r.collapse_step}"
                + (f" (robust z {z:.1f} > {rule.threshold})" if z is not None else "")
                + "; "
            )
            if r.warning_step is not None:
                sentence += (
                    f"the variance proxy ({r.variance_proxy_kind}) warned at step "
                    f"{r.warning_step}, a lead time of {r.lead_steps} steps."
                )
            else:
                sentence += (
                    f"no variance warning in the {rule.lead_horizon} points before "
                    f"(proxy: {r.variance_proxy_kind}), so no lead time."
                )
        verdicts.append(Verdict(f"collapse ({label})", sentence))
    return verdicts


def energy_verdicts(result: EnergyResult, label: str) -> list[Verdict]:
    e, t = result.energy, result.totals
    sentence = (
        f"At checkpoint step {e.step}, the realized energy W(τ) of the {t.responses:,} "
        f"responses has mean {e.sequence_energy_mean:.3g} and median "
        f"{e.sequence_energy_median:.3g} (max/min {e.sequence_energy_max_min_ratio:.3g}); "
        f"inside a group its coefficient of variation has median "
        f"{e.group_energy_cv_median:.2f} over {t.groups} groups, "
        f"{e.groups_with_mixed_rewards} of which have mixed rewards (the only ones a group "
        "baseline learns from)."
    )
    if t.empty_responses:
        sentence += (
            f" {t.empty_responses} responses have no generated token (kept in their groups, "
            f"W = 0), in {len(t.groups_with_empty_responses)} groups: "
            f"{', '.join(t.groups_with_empty_responses[:5])}"
            + (" …" if len(t.groups_with_empty_responses) > 5 else "")
            + "."
        )
    note = zero_tail_note(result.proxies.get("otb", {}), result.proxies.get("mean"))
    if note:
        sentence += f" {note}."
    return [Verdict(f"energy ({label})", sentence)]


def train_verdicts(result: TrainResult, label: str) -> list[Verdict]:
    s, k = result.settings, result.window
    sentence = (
        f"Training with the {s.baseline} baseline at N = {s.group_size}, lr {s.lr:g}, "
        f"{result.totals.steps} steps: mean reward "
        f"{result.early['mean_reward']:.3f} over the first {k} step(s), "
        f"{result.late['mean_reward']:.3f} over the last {k} "
        f"({result.totals.tokens_sampled:,} tokens sampled; one step's reward is noisy, "
        "see the table)."
    )
    return [Verdict(f"training ({label})", sentence)]


def regression_verdict(counts: dict[str, int], source: str) -> Verdict:
    """The status of a comparison with a golden file (or of a regress JUnit report)."""
    total = sum(counts.values())
    failing = total - counts["pass"]
    status = "PASS: every metric agrees" if not failing else f"FAIL: {failing} metric(s) moved"
    sentence = (
        f"Against {source}: {status} ({total} metrics: {counts['pass']} pass, {counts['fail']} "
        f"fail, {counts['missing']} missing, {counts['extra']} extra)."
    )
    return Verdict("regression", sentence)
