"""Realized energy of a set of rollouts and what the baselines make of it (paper figures 3–5).

Per-token statistics come from a forward pass (`policy/forward_pass.py:checkpoint_stats`) or from
the rollouts' logged values (`token_stats.py:logged_stats`); `energy_tables` turns either into
the tidy tables `otb-diag energy` writes. No file I/O here."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch
from torch import Tensor

from otb_diag.maths.energy.heterogeneity import group_heterogeneity
from otb_diag.maths.energy.proxies import proxies_by_baseline
from otb_diag.maths.energy.token_stats import TokenStats
from otb_diag.maths.estimators.advantages import Estimator, batch_advantages
from otb_diag.maths.estimators.registry import baseline_names
from otb_diag.maths.response_batch import ResponseBatch


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
    `with_tokens` the token table is left empty (the live diagnostics need only the others)."""
    names = baseline_names(defaults_only=True) if baselines is None else baselines
    computed = batch_advantages(batch, stats.w, names, estimator)
    mask, energy, returns = batch.mask, computed.energy, computed.returns
    advantages = computed.by_baseline
    proxies = proxies_by_baseline(advantages, mask, stats.w, is_weights=batch.is_weights)

    rows, cols = batch.valid.nonzero(as_tuple=True)
    sequences = sequence_table(batch, energy[:, -1] if energy.shape[1] else energy.sum(-1))
    # Tokens come row by row (row-major over `valid`): each response's W path is one slice.
    ends = np.cumsum(batch.valid.sum(-1).numpy())
    paths = np.split(energy[rows, cols].numpy(), ends[:-1])  # [B] of [length_i]
    groups = group_table(sequences, paths)
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


def sequence_table(batch: ResponseBatch, energy: Tensor) -> pd.DataFrame:
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


def group_table(sequences: pd.DataFrame, paths: Sequence[np.ndarray]) -> pd.DataFrame:
    """One row per group: size, rewards and the energy heterogeneity of its members.

    `paths[i]` is the cumulative energy `W_t` of the response in row i of `sequences`."""
    # Row positions per group on plain arrays: a pandas groupby costs more than the statistics
    # at a live step's few groups. `factorize` numbers groups in order of appearance, as
    # `groupby(sort=False)` visits them.
    codes, names = pd.factorize(sequences["group"])
    reward, length = sequences["reward"].to_numpy(), sequences["length"].to_numpy()
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
