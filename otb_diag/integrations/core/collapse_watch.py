"""The collapse detector of `dynamics/collapse.py`, run while the training goes.

`otb-diag dynamics` applies its rule to a whole log after the run; here the same robust z-scores
(`collapse.robust_z`) are updated one logged point at a time. A point's z needs only the
`window` points before it, so the watch keeps `window + 1` values per series: its memory is the
same after ten steps or a million. `tests/integrations/test_collapse_watch.py` checks that it
flags the step `analyse_run` flags on the same log."""

from __future__ import annotations

import math
from collections import deque

import numpy as np

from otb_diag.dynamics.collapse import DetectionRule, robust_z


class _Series:
    """One positive series (the gradient norm or the variance proxy): its last `window + 1`
    log values, the z of the newest, and the run of consecutive points above a threshold."""

    def __init__(self, rule: DetectionRule, threshold: float) -> None:
        self.rule, self.threshold = rule, threshold
        self.values: deque[float] = deque(maxlen=rule.window + 1)
        self.steps: deque[int] = deque(maxlen=rule.persist)  # steps of the current run
        self.z = math.nan
        self.alarm_step: int | None = None  # first step of the first run of `persist` points

    def add(self, step: int, value: float) -> None:
        if not (math.isfinite(value) and value > 0):
            return  # a point `dynamics` would not count either
        self.values.append(math.log(value))
        r = self.rule
        self.z = float(robust_z(np.array(self.values), r.window, r.min_points, r.min_scale)[-1])
        if self.z > self.threshold:  # NaN counts as below, as in `first_alarm`
            self.steps.append(step)
        else:
            self.steps.clear()
        if self.alarm_step is None and len(self.steps) == r.persist:
            self.alarm_step = self.steps[0]


class CollapseWatch:
    """Feed it the gradient norm and the variance proxy of each logged step; `metrics()` says
    where the detector stands (`otb/collapse/...`, docs/live.md)."""

    def __init__(self, rule: DetectionRule | None = None) -> None:
        self.rule = rule = rule or DetectionRule()
        self.grad = _Series(rule, rule.threshold)
        self.variance = _Series(rule, rule.lead_threshold)

    def add_grad_norm(self, step: int, value: float) -> None:
        self.grad.add(step, value)

    def add_variance(self, step: int, value: float) -> None:
        self.variance.add(step, value)

    @property
    def collapse_step(self) -> int | None:
        return self.grad.alarm_step

    def metrics(self) -> dict[str, float]:
        """z of the newest gradient norm and variance proxy (NaN until `min_points` precede
        them), and 1.0 once a collapse / a variance warning has been flagged, else 0.0."""
        return {
            "collapse/grad_norm_z": self.grad.z,
            "collapse/variance_z": self.variance.z,
            "collapse/alarm": float(self.grad.alarm_step is not None),
            "collapse/warning": float(self.variance.alarm_step is not None),
        }
