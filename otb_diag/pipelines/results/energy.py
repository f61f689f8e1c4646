"""The result of `otb-diag energy`: summary.json's content as fields, and the text it prints."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from otb_diag.pipelines.results import schema
from otb_diag.pipelines.results.schema import RunInputs


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


@dataclass(frozen=True)
class EnergyResult(schema.Versioned):
    """What `otb-diag energy` measured and wrote (`to_json()` is its summary.json)."""

    command: ClassVar[str] = "energy"

    mode: str  # "model" or "model-free"
    inputs: RunInputs
    settings: dict[str, Any]  # EnergySettings as written, plus the TIR decision
    totals: EnergyTotals
    consistency: dict[str, Any]  # the probability tolerance and the clamped counts
    advantage_audit: dict[str, Any] | None  # pipelines/energy/audit.py; None: no trainer advantages
    energy: EnergyStats
    proxies: dict[str, dict[str, float]]  # baseline -> proxy name -> value
    figure_group: str
    distributed: dict[str, Any]
    timings: dict[str, float]
    versions: dict[str, str]
    out: str
    outputs: list[str]

    @property
    def model_free(self) -> bool:
        return self.mode == "model-free"

    def format(self) -> str:
        """The short human summary `otb-diag energy` prints."""
        e, t = self.energy, self.totals
        ckpts = self.inputs.checkpoint_paths
        lines = [
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
        if self.advantage_audit:
            lines += ["", _format_audit(self.advantage_audit)]
        lines += ["", f"wrote {len(self.outputs)} files to {self.out}"]
        return "\n".join(lines)


def _format_audit(audit: dict[str, Any]) -> str:
    """One line on the trainer's advantages against its documented estimator."""
    if "skipped" in audit:
        return f"advantages   not audited: {audit['skipped']}"
    eps = audit["options"].get("eps")
    verdict = (
        "agree"
        if audit["agrees"]
        else f"DIFFER (beyond {audit['tolerance']:.2g}; worst: response {audit['worst_response']})"
    )
    return (
        f"advantages   {audit['trainer']} logged vs registry '{audit['baseline']}'"
        + (f" (ε={eps:g})" if eps is not None else "")
        + f": max |Δ| {audit['max_abs_diff']:.3g}, mean |Δ| {audit['mean_abs_diff']:.3g} over "
        f"{audit['tokens']} tokens of {audit['responses']} responses: {verdict}"
    )
