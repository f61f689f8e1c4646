"""What one step's logged split may hold (`budget_stream.py`'s In), checked before a log is
pooled: a value no run can log is refused (`refused`), and a split that cannot be pooled is
named with why (`unpooled`), where `BudgetPools.update` alone would skip it without a word.

A value is absent when its key is missing or holds NaN (a log reader turns a value that is not
a number into NaN). Where logged, every value is finite, and (the names of `budget_stream.py`):

    P  = split/prompts                  ≥ 1   a count of the step's prompts
    N  = split/group_size               ≥ 2   responses a prompt: the within split needs two
    L̄  = split/mean_response_tokens     ≥ 0   mean generated tokens a response
    split/<name>/within                 ≥ 0   mean_p v_p / N, a mean of sample variances
    split/<name>/total                  ≥ 0   tr Σ = S_m = Σ_p ‖m_p − m̄‖² / (P − 1), a sample
                                              variance, where the name logs `within` (the split
                                              of the step's groups, `step_split.py`); any sign
                                              without it (the two-batch estimate of all
                                              parameters, `two_batch.py`: a difference of squares)
    split/<name>/grad_sq                any   |G|² = ‖m̄‖² − S_m / P, unbiased: negative where the
                                              signal is below the noise

Not pooled, and said: a step whose split is logged without its shape (P, N, L̄ absent); a name
whose `total` or `grad_sq` is absent where its other estimates are logged (at P = 1 there is no
spread between prompts, so TRL's `attach` leaves them out as undefined).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from otb_diag.maths.noise.budget_stream import SPLIT, STEP_SHAPE, split_names

# The step shape's least values (`STEP_SHAPE`'s keys), and why.
SHAPE_FLOORS = {
    "prompts": (1.0, "P, the step's prompts, is a count of at least 1"),
    "group_size": (2.0, "N, the responses a prompt, is at least 2 wherever the split is measured"),
    "mean_response_tokens": (0.0, "L̄, the mean generated tokens a response, is never negative"),
}
WITHIN = "within = mean_p v_p / N is a mean of sample variances, never negative"
TOTAL = "tr Σ of a split with `within` is S_m, a sample variance, never negative"
ESTIMATES = ("total", "grad_sq", "within")  # what is pooled of a name's split


@dataclass(frozen=True)
class Refused:
    """A logged value no run can log: its key, the value and the rule it breaks."""

    key: str
    value: float
    rule: str


def refused(metrics: Mapping[str, float], prefix: str) -> Refused | None:
    """The first value of the split in `metrics` (one step's, keys under `prefix`) that breaks
    the module docstring's rules; None when every logged value keeps them."""
    split = prefix + SPLIT
    checks = [(split + k, floor, why) for k, (floor, why) in SHAPE_FLOORS.items()]
    for name in split_names(_logged(metrics), split, ESTIMATES):
        head = f"{split}{name}/"
        sample_variance = not math.isnan(metrics.get(head + "within", math.nan))
        checks += [
            (head + "within", 0.0, WITHIN),
            (head + "total", 0.0 if sample_variance else None, TOTAL),
            (head + "grad_sq", None, ""),
        ]
    for key, floor, rule in checks:
        value = float(metrics.get(key, math.nan))
        if math.isinf(value):
            return Refused(key, value, "a logged estimate is finite")
        if floor is not None and value < floor:
            return Refused(key, value, rule)
    return None


def unpooled(metrics: Mapping[str, float], prefix: str) -> list[str]:
    """Why the split in `metrics` (one step's), or a name's part of it, is not pooled: one
    reason each, worded without the step so that the steps sharing one are said once; [] when
    the step logs no split or all of it pools."""
    split = prefix + SPLIT
    logged = {k: v for k, v in _logged(metrics).items() if k.startswith(split)}
    if not logged:
        return []
    shape = [split + k for k in STEP_SHAPE if split + k not in logged]
    if shape:
        return [f"the split is logged without the step's shape ({', '.join(shape)} absent)"]
    one_prompt = " (P = 1: no spread between prompts)" if logged[split + "prompts"] == 1 else ""
    reasons = []
    for name in split_names(logged, split, ESTIMATES):
        absent = [f"{split}{name}/{k}" for k in ("total", "grad_sq")]
        absent = [k for k in absent if k not in logged]
        if absent:
            reasons.append(f"{' and '.join(absent)} absent or not a number{one_prompt}")
    return reasons


def _logged(metrics: Mapping[str, float]) -> dict[str, float]:
    """The values of `metrics` that are logged (not NaN)."""
    return {k: v for k, v in metrics.items() if not math.isnan(v)}
