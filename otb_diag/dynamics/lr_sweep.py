"""Choosing a learning rate from a sweep: the lowest rate at which a run becomes unstable.

A run is *unstable* when either sign of collapse appears (docs/theory.md §5):

- a gradient-norm surge: the collapse rule of `collapse.py` fires (the paper's signature);
- a reward collapse: the mean score of its last `window` steps falls below `drop` times that of
  its first `window` steps (how a small policy collapses when every group fails at once: the
  gradient norm then falls to 0 instead of surging, and no surge rule can see it).

The sweep's answer is the lowest unstable rate ("where the mean baseline first becomes
unstable"); when no rate is unstable, the highest rate, said so in the reason.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Stability:
    """One sweep run's verdict: the signs seen and the scores they rest on."""

    lr: float
    surge_step: int | None  # the collapse rule's step, None if it did not fire
    early_score: float  # mean score of the first `window` steps
    late_score: float  # mean score of the last `window` steps
    reward_collapse: bool

    @property
    def unstable(self) -> bool:
        return self.surge_step is not None or self.reward_collapse


def stability(
    lr: float, scores: np.ndarray, surge_step: int | None, window: int = 20, drop: float = 0.5
) -> Stability:
    """The verdict for a run at `lr` with per-step `scores: [S]` (NaN-free) and the collapse
    rule's `surge_step`. With fewer than 2·`window` steps the windows are halves of the run."""
    if len(scores) < 2:
        raise ValueError("a sweep run needs at least 2 logged steps")
    k = min(window, len(scores) // 2)
    early, late = float(np.mean(scores[:k])), float(np.mean(scores[-k:]))
    return Stability(lr, surge_step, early, late, reward_collapse=late < drop * early)


def choose_lr(runs: list[Stability]) -> tuple[float, str]:
    """The lowest unstable rate and why; the highest rate when none is unstable."""
    ordered = sorted(runs, key=lambda r: r.lr)
    for run in ordered:
        if run.unstable:
            signs = []
            if run.surge_step is not None:
                signs.append(f"gradient-norm surge at step {run.surge_step}")
            if run.reward_collapse:
                signs.append(f"mean score fell from {run.early_score:.3f} to {run.late_score:.3f}")
            return run.lr, f"lowest unstable rate ({'; '.join(signs)})"
    top = ordered[-1]
    return top.lr, f"no rate was unstable; the highest, {top.lr:g}, was used"
