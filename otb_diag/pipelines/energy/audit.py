"""The advantage audit of `otb-diag energy` (`maths/estimators/trainer_audit.py`), chunk by
chunk: which registry baseline the trainer documents, each rank's audit of its share of a
chunk's groups, and their combination over the whole pool (max and mean |Δ|, the response of
the largest one numbered in the order of sequences.csv)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pandas as pd
from torch import Tensor

from otb_diag.io.rollouts.readers import Rollouts
from otb_diag.maths.estimators.advantages import Estimator
from otb_diag.maths.estimators.registry import resolve_name, trainer_baseline
from otb_diag.maths.estimators.trainer_audit import audit_part, combine_audits
from otb_diag.maths.response_batch import ResponseBatch
from otb_diag.pipelines.energy.settings import EnergySettings

SKIPPED = (
    "the rollouts carry trainer advantages but the trainer's estimator is unknown: name it "
    "with --trainer-baseline (verl: algorithm.adv_estimator)"
)


def _trainer_of(fmt: str) -> str:
    """The trainer a rollout format names ("trl-parquet" -> "trl"; "jsonl" -> "jsonl")."""
    return fmt.split("-")[0]


def audit_share(
    batch: ResponseBatch, w: Tensor, rollouts: Rollouts, settings: EnergySettings, tir: bool
) -> dict[str, Any] | None:
    """One rank's audit part of one chunk's share (`trainer_audit.audit_part`) against the
    trainer's registry baseline: `--trainer-baseline` when given, else the estimator the rows
    record (`advantage_estimator`, attach's dumps), else the trainer's documented one (TRL's
    default for TRL completion logs); its worst response named by `(group, sample)`;
    `{"skipped": ...}` when no baseline is known; None without trainer advantages."""
    if batch.trainer_advantage is None:
        return None
    trainer = _trainer_of(rollouts.format)
    documented = trainer_baseline(trainer)
    recorded = _recorded_estimator(rollouts)
    if settings.trainer_baseline is not None:
        baseline, options = resolve_name(settings.trainer_baseline), {}
    elif recorded is not None:
        baseline, options = recorded
    elif documented is not None:
        baseline, options = documented
    else:
        return {"skipped": SKIPPED}
    estimator = Estimator(settings.handle_zero_tail, tir, options=options)
    part = audit_part(batch, w, baseline, estimator)
    if part is not None and part["worst_response"] is not None:
        worst = rollouts.responses[part["worst_response"]]
        part["worst_response"] = (worst.group, worst.sample)
    return part


def _recorded_estimator(rollouts: Rollouts) -> tuple[str, dict[str, Any]] | None:
    """The estimator the rows record (`advantage_estimator`), one for the whole share; None
    when no row records one. An `InputError` naming the first row that differs from the first
    recording row, or that records none beside rows that do."""
    records = [(r, r.advantage_estimator) for r in rollouts.responses]
    first = next((est for _, est in records if est is not None), None)
    if first is None:
        return None
    for response, est in records:
        if est != first:
            raise rollouts.error_at(
                response,
                f"this row's advantage_estimator {est} differs from {first} on an earlier row "
                "of the same audit: one audit checks one estimator.",
                field="advantage_estimator",
                hint="Audit each run's dumps separately, or name one with --trainer-baseline.",
            )
    return first


@dataclass
class AuditParts:
    """One step's audit parts, chunk by chunk (rank 0)."""

    parts: list[dict[str, Any]] = field(default_factory=list)
    skipped: bool = False
    responses: int = 0  # sequences of earlier chunks

    def add(self, parts: list[dict[str, Any] | None], sequences: pd.DataFrame) -> None:
        """The ranks' parts of one chunk whose merged sequences table is `sequences`."""
        for part in parts:
            if part is None:
                continue
            if "skipped" in part:
                self.skipped = True
                continue
            if part["worst_response"] is not None:
                group, sample = part["worst_response"]
                row = (sequences["group"] == group) & (sequences["sample"] == sample)
                part = {**part, "worst_response": self.responses + int(row.to_numpy().argmax())}
            self.parts.append(part)
        self.responses += len(sequences)

    def result(self, fmt: str) -> dict[str, Any] | None:
        """summary.json's `advantage_audit`: None without trainer advantages."""
        if self.skipped:
            return {"skipped": SKIPPED}
        if not self.parts:
            return None
        return {"trainer": _trainer_of(fmt), **combine_audits(self.parts)}
