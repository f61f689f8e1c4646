"""The one estimator: rewards and per-token energy in, advantages under registry baselines out
(docs/theory.md §3). `energy`, `variance-compare`, `train`, the trainer audit and the API all
call it, so a baseline means the same numbers in every command.

    G_t = Σ_{k≥t} r_k                           (returns_to_go)
    W_t = Σ_{j≤t} mask_j · w_j                  (cumulative_energy, once; w_j·ρ_j² with weights ρ)
    A_t = (G_t − B_t) · mask_t                  (the baseline's B_t, registry.py)

`Estimator` holds the settings that apply to every baseline: verl's zero tail, the TIR
re-indexing (on by default exactly when a response holds tool output, mask 0 before its end)
and ε; each baseline receives those of them it takes (registry `Baseline.options`), and the
importance weights when it `uses_is_weights`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from torch import Tensor

from otb_diag.maths.energy.token_stats import cumulative_energy
from otb_diag.maths.estimators.registry import get_baseline
from otb_diag.maths.response_batch import ResponseBatch
from otb_diag.maths.returns import returns_to_go


def has_tool_output(mask: Tensor, valid: Tensor | None) -> bool:
    """Tool output inside a response (mask 0 on a valid token) calls for verl's TIR re-indexing.

    Without `valid` (pool tensors), a response's tokens are those up to its last generated one."""
    if valid is None:
        valid = mask.flip(-1).cummax(-1).values.flip(-1)  # 1 up to the row's last mask-1 token
    return bool(((mask == 0) & valid.bool()).any())


@dataclass(frozen=True)
class Estimator:
    """Settings every baseline of one measurement shares.

    `tir=None` decides from the rollouts (`has_tool_output`); `eps=None` keeps each baseline's
    own default (verl's 1e-8 for the energy-weighted ones, 1e-6 for `grpo`); `options` are
    further keyword options, given to the baselines that take them (e.g. TRL's `eps` for an
    audit)."""

    handle_zero_tail: bool = True
    tir: bool | None = None
    eps: float | None = None
    options: Mapping[str, Any] | None = None

    def resolved(self, mask: Tensor, valid: Tensor | None) -> Estimator:
        """This estimator with `tir` decided for rollouts of this `mask` and `valid`."""
        if self.tir is not None:
            return self
        tir = has_tool_output(mask, valid)
        return Estimator(self.handle_zero_tail, tir, self.eps, self.options)

    def keywords(self) -> dict[str, Any]:
        """The options offered to every baseline (each takes those in its signature)."""
        offered: dict[str, Any] = {"handle_zero_tail": self.handle_zero_tail, "tir": bool(self.tir)}
        if self.eps is not None:
            offered["eps"] = self.eps
        return {**offered, **(self.options or {})}


def token_advantages(
    name: str,
    returns: Tensor,
    mask: Tensor,
    group: Tensor,
    energy: Tensor | None,
    *,
    is_weights: Tensor | None = None,
    estimator: Estimator = Estimator(),
) -> Tensor:
    """`[B, T]` advantages of the registry baseline `name`.

    returns: `[B, T]` reward-to-go `G_t`; mask: `[B, T]`; group: `[B]` group ids; energy:
    `[B, T]` realized energy `W_t = cumulative_energy(w, mask)` of a per-token energy (the
    proxy `w_t`, or the exact squared norms), accumulated once by the caller for every
    baseline, given to those that need it; is_weights: `[B, T]` ρ or None. `estimator.tir` must
    be decided (`Estimator.resolved`) — with None it counts as off.
    """
    entry = get_baseline(name)
    if entry.needs_energy and energy is None:
        raise ValueError(f"baseline '{name}' needs the realized energy W")
    offered = estimator.keywords()
    if entry.uses_is_weights:
        offered["is_weights"] = is_weights  # the baseline weights w·ρ² before accumulating
    options = {k: v for k, v in offered.items() if k in entry.options}
    used = energy if entry.needs_energy else None
    return entry.fn(returns, mask, group, used, **options)  # (G_t − B_t)·mask_t


@dataclass(frozen=True)
class Advantages:
    """A batch's returns `G_t`, realized energy `W_t` and advantages per baseline, all `[B, T]`."""

    returns: Tensor
    energy: Tensor
    by_baseline: dict[str, Tensor]
    estimator: Estimator


def batch_advantages(
    batch: ResponseBatch,
    w: Tensor,
    baselines: Sequence[str],
    estimator: Estimator = Estimator(),
) -> Advantages:
    """Advantages of every name in `baselines` for a `ResponseBatch` and its per-token `w`
    (`[B, T]`), with the rollouts' importance weights and `estimator` decided for this batch."""
    estimator = estimator.resolved(batch.mask, batch.valid)
    returns = returns_to_go(batch.token_rewards, batch.mask)  # G_t = Σ_{k≥t} r_k
    energy = cumulative_energy(w, batch.mask)  # W_t = Σ_{j≤t} mask_j·w_j
    by_baseline = {
        name: token_advantages(
            name, returns, batch.mask, batch.group, energy,
            is_weights=batch.is_weights, estimator=estimator,
        )
        for name in baselines
    }  # fmt: skip
    return Advantages(returns, energy, by_baseline, estimator)
