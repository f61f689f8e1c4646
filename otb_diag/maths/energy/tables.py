"""Realized energy of a set of rollouts and what the baselines make of it (paper figures 3–5).

Per-token statistics come from a forward pass (`policy/forward_pass.py:checkpoint_stats`) or from
the rollouts' logged values (`token_stats.py:logged_stats`); `energy_tables` turns either into
the tidy tables `otb-diag energy` writes. No file I/O here."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import numpy as np
import pandas as pd
import torch
from torch import Tensor

from otb_diag.maths.energy.heterogeneity import group_heterogeneity
from otb_diag.maths.energy.proxies import proxies_by_baseline
from otb_diag.maths.energy.token_stats import TokenStats
from otb_diag.maths.estimators.advantages import (
    Advantages,
    Estimator,
    batch_advantages,
    token_advantages,
)
from otb_diag.maths.estimators.registry import baseline_names
from otb_diag.maths.groups import group_total, zero_tail
from otb_diag.maths.response_batch import ResponseBatch

# OTB's proxies that verl's zero tail adds to: `proxies["otb"]["zero_tail/<name>"]` is the part
# of `<name>` due to the tail (`zero_tail_parts`); the rest is `<name>` less it.
ZERO_TAIL = "zero_tail/"
ZERO_TAIL_PROXIES = ("proxy2_total_power", "logit_total_power", "token_total_power")


@dataclass(frozen=True)
class EnergyTables:
    """What `otb-diag energy` writes: `tokens` (one row per response token), `sequences` (one per
    response), `groups` (one per group) and the variance proxies per baseline."""

    tokens: pd.DataFrame
    sequences: pd.DataFrame
    groups: pd.DataFrame
    proxies: dict[str, dict[str, float]]


def energy_tables(
    batch: ResponseBatch,
    stats: TokenStats,
    baselines: Sequence[str] | None = None,
    *,
    estimator: Estimator = Estimator(),
    token_text: Callable[[list[int]], list[str]] | None = None,
    with_tokens: bool = True,
) -> EnergyTables:
    """Tables of energies, returns and advantages.

    `baselines` default to the registry's defaults; every one is computed by the one estimator
    (`batch_advantages`, with the rollouts' importance weights as w·ρ²) under `estimator`.
    `token_text(ids)` names the tokens (the tokenizer's `convert_ids_to_tokens`). Without
    `with_tokens` the token table is left empty (the live diagnostics need only the others).
    OTB's proxies carry their zero-tail parts (`ZERO_TAIL`, `zero_tail_parts`)."""
    names = baseline_names(defaults_only=True) if baselines is None else baselines
    computed, proxies = advantages_and_proxies(batch, stats.w, names, estimator)
    mask, energy, returns = batch.mask, computed.energy, computed.returns
    advantages = computed.by_baseline
    rows, cols = batch.valid.nonzero(as_tuple=True)
    sequences = _sequence_table(batch, energy[:, -1] if energy.shape[1] else energy.sum(-1))
    # Tokens come row by row (row-major over `valid`): each response's W path is one slice.
    ends = np.cumsum(batch.valid.sum(-1).numpy())
    paths = np.split(energy[rows, cols].numpy(), ends[:-1])  # [B] of [length_i]
    tail = zero_tail(mask, batch.group) & mask.bool() if estimator.handle_zero_tail else None
    groups = group_table(sequences, paths, tail)
    if not with_tokens:
        return EnergyTables(pd.DataFrame(), sequences, groups, proxies)
    ids = batch.response_ids[rows, cols]
    tokens = pd.DataFrame(
        {
            "group": np.asarray(batch.group_names, dtype=object)[batch.group[rows].numpy()],
            "sample": batch.sample[rows].numpy(),
            "t": cols.numpy(),
            "token_id": ids.numpy(),
            "token": token_text(ids.tolist()) if token_text else None,
            "mask": mask[rows, cols].to(torch.int8).numpy(),
            "logprob": stats.logprob[rows, cols].numpy(),
            "prob": stats.prob[rows, cols].numpy(),
            "sum_pi2": stats.sum_pi2[rows, cols].numpy(),
            "entropy": stats.entropy[rows, cols].numpy(),
            "w": stats.w[rows, cols].numpy(),
            "W": energy[rows, cols].numpy(),
            "return": returns[rows, cols].numpy(),
            **{f"adv_{b}": a[rows, cols].numpy() for b, a in advantages.items()},
            "temperature": batch.temperature[rows].numpy(),
            "h_sq": stats.h_sq[rows, cols].numpy() if stats.h_sq is not None else math.nan,
        }
    )
    return EnergyTables(tokens, sequences, groups, proxies)


def advantages_and_proxies(
    batch: ResponseBatch, w: Tensor, baselines: Sequence[str], estimator: Estimator
) -> tuple[Advantages, dict[str, dict[str, float]]]:
    """Every baseline's advantages (the one estimator, `batch_advantages`, with the rollouts'
    importance weights as w·ρ²) and variance proxies over `batch` (`w`: `[B, T]` per-token
    proxy), OTB's with their zero-tail parts (`zero_tail_parts`): what `energy_tables` and the
    live step's metrics (`integrations/core/step_metrics.py`) share."""
    computed = batch_advantages(batch, w, baselines, estimator)
    proxies = proxies_by_baseline(
        computed.by_baseline, batch.mask, w, is_weights=batch.is_weights,
        temperature=batch.temperature,
    )  # fmt: skip
    if "otb" in proxies:
        proxies["otb"] |= zero_tail_parts(batch, w, computed, proxies["otb"])
    return computed, proxies


def zero_tail_parts(
    batch: ResponseBatch, w: Tensor, computed: Advantages, otb: dict[str, float]
) -> dict[str, float]:
    """`zero_tail/<name>`: the part of OTB's proxy `<name>` (`otb`, as `computed` ran it) that
    verl's zero tail adds, OTB's proxy less that of the same OTB without the tail.

    In a group whose longest member is strictly longest, the tail gives that member `B_t = 0`,
    so `A_t = G_t`, on its tokens beyond the second-longest (`groups.zero_tail`); without it the
    member is its own baseline there and `A_t ≈ 0`. In a group whose rewards are all equal the
    mean baseline gives 0 everywhere, so the tail is all the gradient OTB gives it. 0 when the
    estimator has no zero tail."""
    if not computed.estimator.handle_zero_tail:
        return {ZERO_TAIL + p: 0.0 for p in ZERO_TAIL_PROXIES}
    estimator = replace(computed.estimator, handle_zero_tail=False)
    without = token_advantages(
        "otb", computed.returns, batch.mask, batch.group, computed.energy,
        is_weights=batch.is_weights, estimator=estimator,
    )  # fmt: skip
    rest = proxies_by_baseline(
        {"otb": without}, batch.mask, w, is_weights=batch.is_weights, temperature=batch.temperature
    )["otb"]
    return {ZERO_TAIL + p: otb[p] - rest[p] for p in ZERO_TAIL_PROXIES}


def _sequence_table(batch: ResponseBatch, energy: Tensor) -> pd.DataFrame:
    """One row per response: `energy` is W(τ) = W_T; `energy_rank` is 1 for the lowest energy
    of its group; `mean_w` averages w over the generated tokens."""
    generated = batch.mask.sum(-1)
    seqs = pd.DataFrame(
        {
            "group": [batch.group_names[g] for g in batch.group.tolist()],
            "sample": batch.sample.numpy(),
            "length": batch.length.numpy(),
            "reward": batch.reward.numpy(),
            "energy": energy.numpy(),
            "mean_w": (energy / generated.clamp_min(1)).numpy(),
        }
    )
    seqs["energy_rank"] = (
        seqs.groupby("group", sort=False)["energy"].rank(method="first").astype(int)
    )
    seqs["generated"] = generated.to(torch.long).numpy()  # tokens with mask 1
    return seqs


def step_summary(batch: ResponseBatch, energy: Tensor) -> dict[str, float]:
    """What the `sequences` and `groups` tables say of one training step, from the tensors
    alone: the live diagnostics log these at every step, where building the tables (and every
    group's heterogeneity, which they do not log) cost more than the step's other metrics.

    energy: `[B, T]` cumulative `W_t` (`batch_advantages`' `energy`), so `W(τ_i) = W_{i,T}`.
    Returns, as the tables define them (a mean and median over the responses, a median over
    the groups, NaN-skipping as pandas'):
        sequence_mean, sequence_median  of W(τ_i)
        mean_w                          Σ_i W(τ_i) / max(1, Σ_i generated_i)
        group_cv_median                 median_g of sd_g/mean_g of W(τ_i) over the members of g
                                        with a token (population sd; NaN for mean ≤ 0)
        mixed_rewards_fraction          share of groups whose rewards are not all equal
        empty_responses                 responses with no generated token (mask all 0)"""
    total = (energy[:, -1] if energy.shape[1] else energy.sum(-1)).double()  # W(τ_i)  [B]
    generated = batch.mask.sum(-1)  # [B]
    group = batch.group
    num_groups = int(group.max()) + 1 if group.numel() else 0
    # group_heterogeneity drops the members without a token (no W_t path to rank)
    member = batch.valid.bool().any(-1).double()  # [B]
    n = group_total(member, group)
    mean = group_total(total * member, group) / n
    sd = (group_total((total - mean) ** 2 * member, group) / n).sqrt()
    cv = torch.where((n > 0) & (mean > 0), sd / mean, math.nan)  # [B], equal within a group
    by_group = total.new_full((num_groups,), math.nan).scatter(0, group, cv)  # [K]
    reward = batch.reward.double()
    high = reward.new_full((num_groups,), -math.inf).scatter_reduce(0, group, reward, "amax")
    low = reward.new_full((num_groups,), math.inf).scatter_reduce(0, group, reward, "amin")
    return {
        "sequence_mean": float(total.mean()),
        "sequence_median": _median(total),
        "mean_w": float(total.sum() / max(1, int(generated.sum()))),
        "group_cv_median": _median(by_group[~by_group.isnan()]),
        "mixed_rewards_fraction": float((high > low).double().mean()),
        "empty_responses": float((generated == 0).sum()),
    }


def _median(x: Tensor) -> float:
    """The median of `[n]` values as pandas takes it: the middle one, or the mean of the two
    middle ones; NaN for none. (torch's `quantile` costs a millisecond a call on the CPU.)"""
    if not len(x):
        return math.nan
    ordered = x.sort().values
    return float(ordered[(len(x) - 1) // 2 : len(x) // 2 + 1].mean())


def group_table(
    sequences: pd.DataFrame, paths: Sequence[np.ndarray], tail: Tensor | None = None
) -> pd.DataFrame:
    """One row per group: size (empty responses counted), rewards, the responses with no
    generated token (`empty_responses`), the generated tokens in verl's zero tail
    (`zero_tail_tokens`, from `tail`: `[B, T]` bool, None for 0) and the energy heterogeneity of
    its members that have a token.

    `paths[i]` is the cumulative energy `W_t` of the response in row i of `sequences`."""
    # Row positions per group on plain arrays: a pandas groupby costs more than the statistics
    # at a live step's few groups. `factorize` numbers groups in order of appearance, as
    # `groupby(sort=False)` visits them.
    codes, names = pd.factorize(sequences["group"])
    reward, length = sequences["reward"].to_numpy(), sequences["length"].to_numpy()
    empty = sequences["generated"].to_numpy() == 0
    tail_tokens = np.zeros(len(reward), np.int64) if tail is None else tail.sum(-1).numpy()
    rows = []
    for k, group in enumerate(names):
        members = np.flatnonzero(codes == k)
        rewards = reward[members]
        rows.append(
            {
                "group": group,
                "size": len(members),
                "mean_reward": float(rewards.mean()),
                "mixed_rewards": bool(np.ptp(rewards) > 0),
                "min_length": int(length[members].min()),
                "max_length": int(length[members].max()),
                "empty_responses": int(empty[members].sum()),
                "zero_tail_tokens": int(tail_tokens[members].sum()),
                **group_heterogeneity([paths[i] for i in members]),
            }
        )
    return pd.DataFrame(rows)


def pick_group(groups: pd.DataFrame) -> str:
    """The group the figures show: among groups with mixed rewards and at least two members
    (else all groups), the one whose energy ranking changes most often along t (figure 4's
    point), ties broken by the energy CV. The CV alone favours short, near-deterministic groups
    with one outlier, whose profiles all coincide."""
    candidates = groups[(groups["size"] > 1) & groups["mixed_rewards"]]
    if candidates.empty:
        candidates = groups
    ranked = candidates.sort_values(
        ["rank_changes", "energy_cv"], ascending=False, na_position="last", kind="stable"
    )
    return str(ranked["group"].iloc[0])
