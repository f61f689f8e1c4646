"""The result of `otb-diag energy`: summary.json's content as fields, and the text it prints."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from otb_diag.pipelines.energy.settings import EnergySettings
from otb_diag.pipelines.results import schema
from otb_diag.pipelines.results.schema import Distributed, RewardSignal, RunInputs


@dataclass(frozen=True)
class EnergyTotals:
    """What was measured: counts over the last checkpoint's responses."""

    responses: int
    groups: int
    response_tokens: int
    generated_tokens: int
    checkpoints: int
    round_trip_issues: int
    prompts_without_chat_template: int
    # Responses with no generated token (aborted generations), kept: each counts in its group's
    # size for the baselines, with W = 0 and A = 0, and in the proxies' means, as in verl.
    empty_responses: int
    groups_with_empty_responses: list[str]


@dataclass(frozen=True)
class EnergyStats:
    """The realized energy at the last checkpoint (`step`): W(τ) = Σ_t w_t per response."""

    step: int
    sequence_energy_mean: float
    sequence_energy_median: float
    sequence_energy_max_min_ratio: float
    mean_w: float  # Σ W(τ) / generated tokens
    group_energy_cv_median: float
    groups_with_mixed_rewards: int
    zero_tail_tokens: int  # generated tokens in verl's zero tail (`maths/groups.py:zero_tail`)


@dataclass(frozen=True)
class Consistency:
    """The probability checks' tolerance and how many values each clamped to it
    (`io/rollouts/probability_checks.py`)."""

    tolerance: float
    clamped: dict[str, int]  # field -> values clamped


@dataclass(frozen=True)
class AdvantageAudit:
    """The trainer's logged advantages against the registry's estimator
    (`pipelines/energy/audit.py`, `maths/estimators/trainer_audit.py:combine_audits`)."""

    trainer: str
    baseline: str
    options: dict[str, float | bool | str]  # the estimator's keyword arguments
    responses: int
    tokens: int
    max_abs_diff: float
    mean_abs_diff: float
    tolerance: float
    agrees: bool
    worst_response: int | None  # the response with the largest |Δ| (None: no token)


@dataclass(frozen=True)
class AuditSkipped:
    """Why the trainer's advantages were not audited."""

    skipped: str


@dataclass(frozen=True)
class EnergyResult(schema.Versioned):
    """What `otb-diag energy` measured and wrote (`to_json()` is its summary.json)."""

    command: ClassVar[str] = "energy"

    mode: str  # "model" or "model-free"
    inputs: RunInputs
    settings: EnergySettings  # auto sizes and `tir` as the run resolved them
    totals: EnergyTotals
    consistency: Consistency
    advantage_audit: AdvantageAudit | AuditSkipped | None  # None: no trainer advantages
    energy: EnergyStats
    proxies: dict[str, dict[str, float]]  # baseline -> proxy name -> value
    figure_group: str
    distributed: Distributed
    timings: dict[str, float]  # phase -> seconds, and `tokens_per_second`
    versions: dict[str, str]
    out: str
    outputs: list[str]

    @property
    def model_free(self) -> bool:
        return self.mode == "model-free"

    def format(self) -> str:
        """The short human summary `otb-diag energy` prints, first whether the rewards carry a
        signal when not every group's does (the energies need none; the baselines' proxies
        compare nothing without one)."""
        e, t = self.energy, self.totals
        ckpts = self.inputs.checkpoint_paths
        signal = RewardSignal(t.groups, e.groups_with_mixed_rewards)
        lead = signal.sentence()
        lines = [] if lead is None else [f"{lead}."]
        if not signal.carries_any:
            lines[0] = lines[0][:-1] + (
                ": the group baselines' proxies below are all 0 and compare nothing (the "
                "energies need no reward and are measured)."
            )
        lines += [
            f"rollouts     {self.inputs.rollouts_path}",
            "checkpoint   "
            + (ckpts[-1] if ckpts else "none (model-free)")
            + (f"  (+{len(ckpts) - 1} earlier)" if len(ckpts) > 1 else ""),
            f"measured     {t.responses} responses in {t.groups} groups, "
            f"{t.response_tokens} tokens x {t.checkpoints} checkpoint(s), "
            f"{self.timings['tokens_per_second']:.0f} tok/s",
            f"energy       mean W(τ) {e.sequence_energy_mean:.3g}, median "
            f"{e.sequence_energy_median:.3g}, max/min {e.sequence_energy_max_min_ratio:.3g}, "
            f"mean w {e.mean_w:.3g}",
            f"groups       median energy CV {e.group_energy_cv_median:.3g}; "
            f"{e.groups_with_mixed_rewards} of {t.groups} have mixed rewards; "
            f"figures show group {self.figure_group}",
            "",
            f"{'baseline':<10} {'proxy2_total_power':>19} {'token_total_power':>18} "
            f"{'expected_a_squared':>19}",
        ]
        for name, p in self.proxies.items():
            lines.append(
                f"{name:<10} {p['proxy2_total_power']:>19.4g} {p['token_total_power']:>18.4g} "
                f"{p['expected_a_squared']:>19.4g}"
            )
        if signal.carries_any:  # else every part is 0
            lines += _format_zero_tail(self.proxies, e, t.groups)
        if t.empty_responses:
            shown = ", ".join(t.groups_with_empty_responses[:5])
            more = len(t.groups_with_empty_responses) - 5
            lines.append(
                f"empty        {t.empty_responses} responses with no generated token, kept in "
                f"their groups (W = 0, A = 0): {shown}" + (f" (+{more} more)" if more > 0 else "")
            )
        if self.advantage_audit:
            lines += ["", _format_audit(self.advantage_audit)]
        lines += ["", f"wrote {len(self.outputs)} files to {self.out}"]
        return "\n".join(lines)


ZERO_TAIL_SPLIT = ("proxy2_total_power", "token_total_power")  # printed with their tail part


def zero_tail_note(otb: dict[str, float], mean: dict[str, float] | None) -> str | None:
    """The note printed where verl's zero tail lifts OTB's `proxy2_total_power` above the mean
    baseline's (`otb`, `mean`: their proxies, OTB's with `zero_tail/` parts), else None."""
    name = "proxy2_total_power"
    tail = otb.get(f"zero_tail/{name}")
    if tail is None or not mean or mean[name] <= 0:
        return None
    with_tail, without = otb[name] / mean[name], (otb[name] - tail) / mean[name]
    if with_tail <= 1 or without > 1:
        return None
    return (
        f"OTB/mean {with_tail:.3g} with verl's zero tail, {without:.3g} without; the tail gives "
        "the longest member of an all-correct group A = R on its tokens beyond the "
        "second-longest, where the mean baseline gives 0 (docs/theory.md, 'The zero tail')"
    )


def _format_zero_tail(
    proxies: dict[str, dict[str, float]], e: EnergyStats, groups: int
) -> list[str]:
    """OTB's proxies split into verl's zero tail and the rest, and the note when the tail makes
    OTB's exceed the mean baseline's; nothing when OTB was not measured."""
    otb = proxies.get("otb")
    if not isinstance(otb, dict) or "zero_tail/proxy2_total_power" not in otb:
        return []
    tails = {p: otb["zero_tail/" + p] for p in ZERO_TAIL_SPLIT}
    parts = [f"{p} {otb[p]:.4g} = {t:.4g} tail + {otb[p] - t:.4g} rest" for p, t in tails.items()]
    equal = groups - e.groups_with_mixed_rewards
    lines = [
        f"zero tail    OTB {'; '.join(parts)}; {e.zero_tail_tokens} tokens in the tail; "
        f"{equal} of {groups} groups ({equal / max(groups, 1):.0%}) have all-equal rewards"
    ]
    note = zero_tail_note(otb, proxies.get("mean"))
    return lines + ([f"note         {note}"] if note else [])


def _format_audit(audit: AdvantageAudit | AuditSkipped) -> str:
    """One line on the trainer's advantages against its documented estimator."""
    if isinstance(audit, AuditSkipped):
        return f"advantages   not audited: {audit.skipped}"
    eps = audit.options.get("eps")
    verdict = (
        "agree"
        if audit.agrees
        else f"DIFFER (beyond {audit.tolerance:.2g}; worst: response {audit.worst_response})"
    )
    return (
        f"advantages   {audit.trainer} logged vs registry '{audit.baseline}'"
        + (f" (ε={eps:g})" if eps is not None else "")
        + f": max |Δ| {audit.max_abs_diff:.3g}, mean |Δ| {audit.mean_abs_diff:.3g} over "
        f"{audit.tokens} tokens of {audit.responses} responses: {verdict}"
    )
