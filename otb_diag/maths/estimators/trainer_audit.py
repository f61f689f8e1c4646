"""Advantage audit: do the advantages a trainer logged match the estimator it documents?

The trainer's advantages `A^trainer` (`[B, T]`, one number per response broadcast over its
tokens, as TRL logs them, or one per token) are compared with the registry baseline of that
trainer recomputed from the same rewards and groups, `A^registry = (G_t − B_t)·mask_t`
(docs/theory.md §3), on the generated tokens (mask 1):

    max_abs_diff  = max_{i,t: mask=1} |A^trainer_{i,t} − A^registry_{i,t}|
    mean_abs_diff = mean_{i,t: mask=1} |A^trainer_{i,t} − A^registry_{i,t}|

`agrees` is `max_abs_diff ≤ tolerance`, with

    tolerance = AGREEMENT_REL · max(1, max |A^registry|) + ROUNDING_ULPS · 2⁻²³ · max |R| / ε

Both sides are float32 computations of the same formula (TRL logs float32 advantages), which
differ by a few ulps; but a group whose rewards are all equal has `std ≈ 0`, and the rounding
of `R − mean` (ulps of `|R|`) is then divided by `std + ε ≈ ε`: with ε = 1e-4 and rewards of
0.1, a real TRL 1.16 run logged advantages of 7.45e-5 where the exact value is 0. The second
term allows for that (ε = 1 for baselines other than `grpo`, the only one dividing by a std).
A different estimator, ε or grouping differs by orders of magnitude more.

Which registry baseline a trainer runs is declared by the registry entry (`trainers`,
`registry.trainer_baseline`):
- TRL `GRPOTrainer` (defaults `scale_rewards="group"`, `multi_objective_aggregation=
  "sum_then_normalize"`): `(R − mean_group R) / (std_group R + 1e-4)`, unbiased std
  (`trl.trainer.utils.nanstd`, Bessel's correction), i.e. `grpo` with `eps = 1e-4`;
- TRL `RLOOTrainer` (`beta=0`, `normalize_advantages=False`): `R_i − mean_{j≠i} R_j`, i.e.
  `rloo` (registry trainer name `trl-rloo`);
- verl: the estimator named by its `algorithm.adv_estimator`, given here by name (`grpo` uses
  verl's `eps = 1e-6`, `otb` verl's OTB conventions).
"""

from __future__ import annotations

import inspect
from typing import Any

import torch
from torch import Tensor

from otb_diag.maths.energy.token_stats import cumulative_energy
from otb_diag.maths.estimators.advantages import Estimator, token_advantages
from otb_diag.maths.estimators.registry import get_baseline
from otb_diag.maths.response_batch import ResponseBatch
from otb_diag.maths.returns import returns_to_go

AGREEMENT_REL = 1e-4
ROUNDING_ULPS = 8


def advantage_audit(
    batch: ResponseBatch, w: Tensor, baseline: str, estimator: Estimator = Estimator()
) -> dict[str, Any] | None:
    """Compare `batch.trainer_advantage` with `baseline`'s advantages (None when the rollouts
    carry no trainer advantages). `w` is the per-token proxy `[B, T]` (energy-weighted
    baselines need it); the advantages come from the one estimator under `estimator`."""
    part = audit_part(batch, w, baseline, estimator)
    return None if part is None else combine_audits([part])


def audit_part(
    batch: ResponseBatch, w: Tensor, baseline: str, estimator: Estimator = Estimator()
) -> dict[str, Any] | None:
    """The audit's sums and maxima over `batch` (whole groups: the baseline needs them), to be
    combined over the parts of a pool by `combine_audits`; `worst_response` is an index into
    `batch` (a caller combining parts makes it one into the pool). None without trainer
    advantages."""
    trainer = batch.trainer_advantage
    if trainer is None:
        return None
    mask = batch.mask
    estimator = estimator.resolved(mask, batch.valid)
    returns = returns_to_go(batch.token_rewards, mask)  # G_t = Σ_{k≥t} r_k
    energy = cumulative_energy(w, mask)  # W_t = Σ_{j≤t} mask_j·w_j
    registry = token_advantages(
        baseline, returns, mask, batch.group, energy, is_weights=batch.is_weights,
        estimator=estimator,
    )  # fmt: skip
    on = mask.bool()
    diff = (trainer - registry).abs()[on].double()  # |A^trainer − A^registry| on mask 1
    return {
        "baseline": baseline,
        "options": estimator.keywords(),
        "responses": int(batch.group.numel()),
        "tokens": int(on.sum()),
        "max_abs_diff": float(diff.max()) if diff.numel() else 0.0,
        "sum_abs_diff": float(diff.sum()),
        "registry_max": float(registry[on].abs().max()) if on.any() else 0.0,
        "reward_max": float(batch.reward.abs().max()) if batch.reward.numel() else 0.0,
        "worst_response": int(torch.nonzero(on)[int(diff.argmax())][0]) if diff.numel() else None,
    }


def combine_audits(parts: list[dict[str, Any]]) -> dict[str, Any]:
    """The audit of a pool from its parts (`audit_part`, same baseline and options): max and
    token-weighted mean of |Δ| over all parts, and the tolerance of the module docstring from
    the pool's max |A^registry| and max |R|."""
    baseline, options = parts[0]["baseline"], parts[0]["options"]
    tokens = sum(p["tokens"] for p in parts)
    worst = max(parts, key=lambda p: p["max_abs_diff"])
    max_diff = worst["max_abs_diff"]
    scale = max(1.0, *(p["registry_max"] for p in parts))
    rewards = max(p["reward_max"] for p in parts)
    rounding = ROUNDING_ULPS * 2.0**-23 * rewards / _std_eps(baseline, options)
    tolerance = AGREEMENT_REL * scale + rounding
    return {
        "baseline": baseline,
        "options": options,
        "responses": sum(p["responses"] for p in parts),
        "tokens": tokens,
        "max_abs_diff": max_diff,
        "mean_abs_diff": sum(p["sum_abs_diff"] for p in parts) / tokens if tokens else 0.0,
        "tolerance": tolerance,
        "agrees": bool(max_diff <= tolerance),
        "worst_response": worst["worst_response"],
    }


def _std_eps(baseline: str, options: dict[str, Any]) -> float:
    """The ε added to the group std (`grpo`: the option, else its default), 1 otherwise."""
    if baseline != "grpo":
        return 1.0
    default = inspect.signature(get_baseline(baseline).fn).parameters["eps"].default
    return float(options.get("eps", default))
