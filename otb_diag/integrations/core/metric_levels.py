"""Which of a step's `otb/` metrics reach the trainer's dashboard, and the full record beside it.

A step computes 100–170 `otb/` scalars (every baseline's proxies, the split under each
estimator, both pools of each with their intervals). On W&B or TensorBoard that is a wall of
panels where a person needs about ten answers, so the default level logs the answers alone
(`HEADLINE`, at most 20 keys a step) and `metrics="all"` logs every one. Whatever the level,
the main process appends every metric of every measured step to `otb_metrics.jsonl` in the
trainer's output directory (`FullRecord`): `otb-diag dynamics` reads it beside the trainer's
own log (`io/training_logs.py`), so nothing it pools or draws is lost to the dashboard's level.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from pathlib import Path

from otb_diag.errors import InputError
from otb_diag.io.trainers.trl import OTB_RECORD
from otb_diag.io.training_logs import (
    CONTROLLER_DECIDED,
    CONTROLLER_PROMPTS,
    CONTROLLER_UPDATES,
    MEAN_ENERGY,
    OTB_OVER_MEAN,
    OTB_OVER_MEAN_WITHOUT_TAIL,
)

LEVELS = ("default", "all")
# The answers a person reads, `{own}` the trainer's estimator (the one its advantages are, or
# `otb` when it is not known), under the prefix `otb/`; the pooled ones exist on split steps.
HEADLINE = (
    OTB_OVER_MEAN,  # OTB's variance proxy over the mean baseline's
    OTB_OVER_MEAN_WITHOUT_TAIL,  # the same without verl's zero tail
    "budget/{own}/window/within_share",  # the share of the noise within prompts, pooled
    # the knee in prompts a step pooled over the run's split steps, with its interval (not one
    # step's, `split/<b>/one_step_noise_scale`, left to the full record)
    "budget/{own}/window/noise_scale",
    "budget/{own}/window/noise_scale_low",
    "budget/{own}/window/noise_scale_high",
    "budget/{own}/window/resolved",  # 1 when |G|²'s interval lies above 0 (a knee is claimed)
    "budget/{own}/window/knee_tokens",  # tokens a step at the knee
    "budget/otb/window/noise_scale",  # OTB's knee beside the trainer's
    "budget/params/window/noise_scale",  # all parameters, under DDP
    "audit/agrees",  # the trainer's advantages are the estimator it documents
    "audit/max_abs_diff",
    "collapse/alarm",
    "collapse/warning",
    "groups/empty_responses",
    MEAN_ENERGY,  # the realized energy W(τ) of a response, mean
    CONTROLLER_PROMPTS,  # the prompts of the update the step trains in (knee controller)
    CONTROLLER_DECIDED,  # the controller's decision, which the next update to open takes
    CONTROLLER_UPDATES,  # its optimizer updates so far (TRL's step counts generation batches)
)


def check_level(level: str) -> str:
    """`level` when it is one of `LEVELS`; an `InputError` otherwise."""
    if level not in LEVELS:
        raise InputError(
            f"metrics must be one of {', '.join(map(repr, LEVELS))}; got {level!r}.",
            hint="'default' logs the ~15 answers a person reads, 'all' every otb/ metric.",
        )
    return level


def logged_at(
    metrics: Mapping[str, float], level: str, own: str | None, prefix: str = "otb/"
) -> dict[str, float]:
    """The metrics of `level` that `metrics` holds: all of them, or the `HEADLINE` keys with
    `{own}` the trainer's estimator (`otb` when None)."""
    if level == "all":
        return dict(metrics)
    keys = dict.fromkeys(prefix + k.format(own=own or "otb") for k in HEADLINE)
    return {k: metrics[k] for k in keys if k in metrics}


class FullRecord:
    """`otb_metrics.jsonl` in `folder`: one JSON line a measured step, `{"step": s, ...}` with
    every metric (non-finite values left out, as the trainer's log leaves them out), flushed
    at once so a stopped run keeps its steps. A run that starts at step 1 starts the file anew
    (as the trainer's own log starts anew); one resumed from a checkpoint appends to it."""

    def __init__(self, folder: str | Path) -> None:
        self.path = Path(folder) / OTB_RECORD
        self._started = False

    def append(self, step: int, metrics: Mapping[str, float]) -> None:
        row = {"step": step} | {k: v for k, v in metrics.items() if math.isfinite(v)}
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.path.open("a" if self._started or step > 1 else "w") as f:
            f.write(json.dumps(row) + "\n")
        self._started = True
