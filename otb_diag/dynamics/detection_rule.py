"""The parameters of the collapse and lead-time rules (`collapse.py` applies them), declared once
for the command line and the API."""

from __future__ import annotations

from dataclasses import dataclass

from otb_diag.errors import InputError
from otb_diag.knobs import Checked, at_least, internal, knob


@dataclass(frozen=True)
class DetectionRule(Checked):
    """Parameters of the collapse and lead-time rules (see the module docstring)."""

    window: int = knob(30, at_least(5), help="Trailing logged points of the z-score.")
    # The history the z-score needs before it is trusted; None: min(10, window).
    min_points: int = internal(None)  # type: ignore[assignment]
    threshold: float = knob(6.0, at_least(0), help="Robust z of a gradient-norm surge.")
    persist: int = knob(3, at_least(1), help="Consecutive points an alarm must last.")
    lead_threshold: float = knob(3.0, at_least(0), help="Robust z of a variance rise.")
    lead_horizon: int = knob(50, at_least(1), help="Points before a collapse searched for it.")
    min_scale: float = internal(0.05)
    smooth: int = knob(5, at_least(1), help="Trailing points averaged for the score.")

    def together(self) -> None:
        """The internal fields, which no option checks: `min_points` defaults to
        min(10, window) and lies in 1..window; `min_scale` is positive."""
        if self.min_points is None:
            object.__setattr__(self, "min_points", min(10, self.window))
        if not 1 <= self.min_points <= self.window:
            raise InputError(f"need 1 <= min_points <= window, got {self.min_points}")
        if self.min_scale <= 0:
            raise InputError(f"min_scale must be positive, got {self.min_scale}")

    def describe(self) -> str:
        """The rule in one paragraph, for collapse.json and the printed summary."""
        return (
            f"collapse: first of {self.persist} consecutive logged points with robust z of "
            f"log grad_norm > {self.threshold:g}, z = (x - median) / max(1.4826 MAD, "
            f"{self.min_scale:g}) over the previous {self.window} points (at least "
            f"{self.min_points}); warning: the same on the variance proxy with z > "
            f"{self.lead_threshold:g}, starting within the {self.lead_horizon} points up to "
            f"the collapse; lead = collapse step - warning step; tokens to target: first "
            f"tokens_sampled where the trailing {self.smooth}-point mean score >= target"
        )
