"""The result of `otb-diag energy`: summary.json's content as fields, and the text it prints."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from otb_diag.pipelines.energy.settings import EnergySettings
from otb_diag.pipelines.results import schema
from otb_diag.pipelines.results.schema import Distributed, RewardSignal, RunInputs, counted


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

    def proxy_rows(self) -> dict[str, ProxyRow]:
        """The proxies' table as printed: each baseline's row, each value 0 where it is 0 to
        `ZERO_RTOL` of its column's largest (`ProxyRow.cells`)."""
        scales = [max(abs(p[c]) for p in self.proxies.values()) for c in PROXY_COLUMNS]
        return {name: ProxyRow(name, p, scales) for name, p in self.proxies.items()}

    def no_signal_sentence(self) -> str:
        """Why no baseline can be told from another here, and what the proxies' table below
        shows of it, read off its rows as printed (`proxy_rows`): which are 0, which equal
        `none`'s, and which neither and why (verl's zero tail, else advantages that do not
        vanish on equal rewards). With groups of one (as many groups as responses) every
        group baseline is 0: its row is `none`'s."""
        t, rows = self.totals, self.proxy_rows()
        none = rows.get("none")
        zero = [n for n, r in rows.items() if n != "none" and r.is_zero()]
        like_none = [n for n, r in rows.items() if n not in ("none", *zero) and r == none]
        other = [n for n in rows if n not in ("none", *zero, *like_none)]
        if t.responses == t.groups:
            lead = (
                f"no signal: each of the {counted(t.groups, 'group')} holds one response, and "
                "with groups of one every group baseline is 0"
            )
        else:
            lead = (
                f"no signal: each of the {counted(t.groups, 'group')} has equal rewards within "
                "it, so no baseline can be told from another"
            )
        parts = []
        if zero:
            parts.append(f"the proxies of {_names(zero)} below are 0 and compare nothing")
        if like_none:
            parts.append(f"the proxies of {_names(like_none)} equal none's and compare nothing")
        parts += [
            f"{name}'s are neither 0 nor none's: {rows[name].why_not_zero()}" for name in other
        ]
        return f"{lead}: {'; '.join(parts)}. The energies need no reward and are measured"

    def format(self) -> str:
        """The short human summary `otb-diag energy` prints, first whether the rewards carry a
        signal when not every group's does (the energies need none; the baselines' proxies
        compare nothing without one)."""
        e, t = self.energy, self.totals
        ckpts = self.inputs.checkpoint_paths
        signal = RewardSignal(t.groups, e.groups_with_mixed_rewards)
        lead = signal.sentence() if signal.carries_any else self.no_signal_sentence()
        lines = [] if lead is None else [f"{lead}."]
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
            f"{'baseline':<10}" + "".join(f"{c:>{len(c) + 2}}" for c in PROXY_COLUMNS),
        ]
        for name, row in self.proxy_rows().items():
            cells = zip(row.cells(), PROXY_COLUMNS, strict=True)
            lines.append(f"{name:<10}" + "".join(f"{v:>{len(c) + 2}}" for v, c in cells))
        if signal.carries_any:  # else the sentence above says where OTB's proxies come from
            lines += _format_zero_tail(self.proxies, e, t.groups)
        if t.empty_responses:
            shown = ", ".join(t.groups_with_empty_responses[:5])
            more = len(t.groups_with_empty_responses) - 5
            lines.append(
                f"empty        {counted(t.empty_responses, 'response')} with no generated "
                f"token, kept in their groups (W = 0, A = 0): {shown}"
                + (f" (+{more} more)" if more > 0 else "")
            )
        if self.advantage_audit:
            lines += ["", _format_audit(self.advantage_audit)]
        lines += ["", f"wrote {len(self.outputs)} files to {self.out}"]
        return "\n".join(lines)


ZERO_TAIL_SPLIT = ("proxy2_total_power", "token_total_power")  # printed with their tail part
PROXY_COLUMNS = ("proxy2_total_power", "token_total_power", "expected_a_squared")  # the table's
# A proxy within this share of its column's largest value (over the baselines) is 0: the
# rounding of a group mean of equal rewards (float32, an ulp of R) squared stays far below it.
ZERO_RTOL = 1e-9


@dataclass(frozen=True)
class ProxyRow:
    """One baseline's row of the proxies' table: its `proxies` and each printed column's
    largest value over the baselines (`scales`), against which a value is 0. Two rows are
    equal when they print alike (`cells`): the sentences say what the table shows."""

    name: str
    proxies: dict[str, float]
    scales: list[float]

    def values(self) -> list[float]:
        return [self.proxies[c] for c in PROXY_COLUMNS]

    def zero(self, value: float, scale: float) -> bool:
        return abs(value) <= ZERO_RTOL * scale

    def cells(self) -> list[str]:
        """The row as printed: `.4g`, and 0 where the value is 0 (`zero`)."""
        pairs = zip(self.values(), self.scales, strict=True)
        return ["0" if self.zero(v, s) else f"{v:.4g}" for v, s in pairs]

    def is_zero(self) -> bool:
        return all(cell == "0" for cell in self.cells())

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ProxyRow) and self.cells() == other.cells()

    def why_not_zero(self) -> str:
        """Where a row that is not 0 on equal rewards comes from: all of it in verl's zero tail
        (the columns split at the tail, `ZERO_TAIL_SPLIT`, equal their `zero_tail/` parts),
        else its advantages, which need not vanish there."""
        cells = " / ".join(self.cells())
        split = [PROXY_COLUMNS.index(c) for c in ZERO_TAIL_SPLIT]
        in_tail = all(f"zero_tail/{c}" in self.proxies for c in ZERO_TAIL_SPLIT) and all(
            self.zero(self.values()[i] - self.proxies[f"zero_tail/{PROXY_COLUMNS[i]}"],
                      self.scales[i])
            for i in split
        )  # fmt: skip
        if in_tail:
            return (
                f"{cells}, all of it in verl's zero tail (a group's longest member keeps A = R "
                "on its tokens beyond the second-longest; docs/theory.md, 'The zero tail')"
            )
        return f"{cells}; its advantages do not vanish on equal rewards"


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
        f"zero tail    OTB {'; '.join(parts)}; {counted(e.zero_tail_tokens, 'token')} in the "
        "tail; "
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


def _names(names: list[str]) -> str:
    """`a`, `a and b`, `a, b and c`."""
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"
