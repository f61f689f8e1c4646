"""A training problem whose noise scale is known in closed form and moves while it trains: the
synthetic truth for the knee controller (`integrations/core/controller.py`), shared by
tests/integrations/test_controller.py and bench/bench_controller.py.

Least squares in d dimensions, θ* = 0. A prompt is an input `x ~ N(0, I_d)`; each of its N
responses a noisy label `y = x·θ* + σ ε`, `ε ~ N(0, 1)`. A response's gradient is
`g = x (x·θ − y)`, so with `δ = θ − θ*`:

    G = E g = δ                                  (E x xᵀ = I)
    tr Σ = (d + 1) |δ|² + d σ² / N               a prompt's estimate (the mean of its N
                                                 responses): between prompts (d + 1)|δ|²,
                                                 within them d σ² / N
    B(θ) = tr Σ / |G|² = (d + 1) + d σ² / (N |δ|²)

which grows from about d + 1 as the run converges (|δ| shrinks). A step of P prompts moves θ by
`η ĝ` with `η = c / (1 + B(θ) / P)`: a fraction c of the optimal step of McCandlish et al.
(2018), the setting in which their steps-examples relation holds exactly,

    S(P) = S_min (1 + B_eff / P),  E = S · P = E_min (1 + P / B_eff),  B_eff = E_min / S_min,

with B_eff an average of B(θ) along the run; a batch that tracks B(θ) itself lands at the
curve's knee, `(2 S_min, 2 E_min)` (the oracle run shows it). The learning rate is the
problem's: it reads the true B, the controller only the step's samples."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from otb_diag.maths.noise.budget_stream import BudgetPools
from otb_diag.maths.noise.step_split import step_split

D, N, SIGMA = 16, 2, 1.0  # dimensions, responses a prompt, label noise
START, TARGET = 4.0, 0.02  # |δ|² at the start, and the target that ends a run
STEP = 0.01  # c: the fraction of the optimal step
ESTIMATOR = "truth"  # the name the split is logged and pooled under
PREFIX = "otb/"


def true_knee(delta_sq: float) -> float:
    """B(θ) at |δ|² = `delta_sq`."""
    return (D + 1) + D * SIGMA**2 / (N * delta_sq)


@dataclass
class Run:
    """One run to the target: optimizer steps, examples (prompts) used, and per step the
    prompts it took, the true knee, and the pooled record's metrics (controlled runs only)."""

    steps: int
    examples: int
    prompts: list[int]
    knees: list[float]
    records: list[dict[str, float]]


def responses(rng: np.random.Generator, delta: np.ndarray, prompts: int) -> np.ndarray:
    """`[P·N, d]` the step's response gradients `g = x (x·δ − σ ε)`, N consecutive rows a
    prompt."""
    x = rng.standard_normal((prompts, D))
    eps = rng.standard_normal((prompts, N)) * SIGMA
    g = x[:, None, :] * ((x @ delta)[:, None] - eps)[:, :, None]  # [P, N, d]
    return g.reshape(prompts * N, D)


def split_metrics(g: np.ndarray, prompts: int) -> dict[str, float]:
    """The step's logged split (`step_split` on its own responses) and shape, as the live
    diagnostics log them (`otb/split/...`)."""
    split = step_split(torch.from_numpy(g), torch.arange(prompts * N) // N)
    shape = {"prompts": prompts, "group_size": N, "mean_response_tokens": 1.0}
    out = {f"{PREFIX}split/{k}": float(v) for k, v in shape.items()}
    return out | {f"{PREFIX}split/{ESTIMATOR}/{k}": v for k, v in split.items()}


def train(seed: int, batch: Callable[[float], int] | int, controller: object | None = None) -> Run:
    """A run from a seeded start to |δ|² ≤ `TARGET`. `batch`: a fixed P, or P from the true
    knee (the oracle); with `controller` (a `KneeController`), P is its `prompts`, and each
    step's split is pooled (`BudgetPools`) and fed to it."""
    rng = np.random.default_rng(seed)
    delta = rng.standard_normal(D)
    delta *= math.sqrt(START) / np.linalg.norm(delta)
    pools = BudgetPools(PREFIX)
    run = Run(0, 0, [], [], [])
    while delta @ delta > TARGET:
        knee = true_knee(float(delta @ delta))
        if controller is not None:
            prompts = controller.prompts  # type: ignore[attr-defined]
        else:
            prompts = batch if isinstance(batch, int) else batch(knee)
        g = responses(rng, delta, prompts)
        if controller is not None:
            metrics = split_metrics(g, prompts)
            record = metrics | pools.update(metrics, run.steps + 1)
            controller.feed(record)  # type: ignore[attr-defined]
            run.records.append(record)
        delta = delta - STEP / (1 + knee / prompts) * g.mean(0)
        run.steps, run.examples = run.steps + 1, run.examples + prompts
        run.prompts.append(prompts)
        run.knees.append(knee)
    return run


def knee_of_curve(points: list[tuple[int, int]]) -> tuple[float, float]:
    """`(S_min, E_min)` of fixed-batch runs `(P, S)`: the least-squares fit of
    `S = S_min + E_min / P`, the steps-examples relation written in 1/P."""
    p, s = np.array(points, dtype=float).T
    design = np.stack([np.ones_like(p), 1 / p], 1)
    s_min, e_min = np.linalg.lstsq(design, s, rcond=None)[0]
    return float(s_min), float(e_min)
