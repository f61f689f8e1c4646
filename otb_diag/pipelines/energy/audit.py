"""The advantage audit of `otb-diag energy` (`maths/estimators/trainer_audit.py`), chunk by
chunk: which registry baseline the trainer documents, each rank's audit of its share of a
chunk's groups, and their combination over the whole pool (max and mean |Δ|, the response of
the largest one numbered in the order of sequences.csv)."""

from __future__ import annotations

from typing import Any

import pandas as pd
from torch import Tensor

from otb_diag.io.rollouts.readers import Rollouts
from otb_diag.maths.estimators.advantages import Estimator
from otb_diag.maths.estimators.registry import resolve_name, trainer_baseline
from otb_diag.maths.estimators.trainer_audit import audit_part, combine_audits
from otb_diag.maths.response_batch import ResponseBatch

SKIPPED = (
    "the rollouts carry trainer advantages but the trainer's estimator is unknown: name it "
    "with --trainer-baseline (verl: algorithm.adv_estimator)"
)


def trainer_of(fmt: str) -> str:
    """The trainer a rollout format names ("trl-parquet" -> "trl"; "jsonl" -> "jsonl")."""
    return fmt.split("-")[0]


def audit_share(
    batch: ResponseBatch, w: Tensor, rollouts: Rollouts, settings: Any, tir: bool
) -> dict[str, Any] | None:
    """One rank's audit part of one chunk's share (`trainer_audit.audit_part`) against the
    trainer's registry baseline (TRL's default for TRL completion logs, else
    `--trainer-baseline`), its worst response named by `(group, sample)`; `{"skipped": ...}`
    when no baseline is known; None without trainer advantages."""
    if batch.trainer_advantage is None:
        return None
    trainer = trainer_of(rollouts.format)
    documented = trainer_baseline(trainer)
    if settings.trainer_baseline is not None:
        baseline, options = resolve_name(settings.trainer_baseline), {}
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


class AuditParts:
    """One step's audit parts, chunk by chunk (rank 0)."""

    def __init__(self) -> None:
        self.parts: list[dict[str, Any]] = []
        self.skipped = False
        self.responses = 0  # sequences of earlier chunks

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
        return {"trainer": trainer_of(fmt), **combine_audits(self.parts)}
