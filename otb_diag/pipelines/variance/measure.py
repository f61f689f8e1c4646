"""One checkpoint's measurements for `otb-diag variance-compare`: the pool tokenized once under
the checkpoint, per-token statistics and the score vectors of each model mode measured on each
rank's share of the groups (`otb_diag/runtime/sharded.py`), and the shares put back into the
pool's `[B, T]` tensors on rank 0."""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from otb_diag.io.batches import checkpoint_rollouts
from otb_diag.io.checkpoint import Checkpoint
from otb_diag.io.load_options import LoadOptions
from otb_diag.io.rollouts.readers import Rollouts
from otb_diag.io.rollouts.to_batch import make_batch
from otb_diag.maths.response_batch import ResponseBatch
from otb_diag.pipelines.measure_knobs import planned
from otb_diag.pipelines.variance.settings import VarianceSettings
from otb_diag.policy.forward_pass import checkpoint_stats
from otb_diag.policy.scores.token_scores import TokenScores, token_scores
from otb_diag.runtime.sharded import Part, Shards
from otb_diag.runtime.torchrun import agreed

# What a rank measures of its rows: w `[b, t]` and each model mode's scores over them.
Rows = tuple[Tensor, dict[str, TokenScores]]


@dataclass
class Measured:
    """One checkpoint's measurements over the whole pool (rank 0)."""

    batch: ResponseBatch
    w: Tensor  # [B, T]
    scores: dict[str, TokenScores]  # model mode -> its scores over the pool
    settings: VarianceSettings  # auto sizes as the statistics pass resolved them (`planned`)


def measure(
    path: Path,
    rollouts: Rollouts,
    groups: list[list[int]],
    shards: Shards[int],
    settings: VarianceSettings,
    bar: Any,
    notify: Callable[[str], None] | None,
) -> tuple[Checkpoint, Measured | None]:
    """The pool (`rollouts`, whose `groups` list each group's rows) measured under the
    checkpoint at `path`, tokenized once by every rank; each rank measures the rows of its
    groups (`shards`), rank 0 rebuilds the pool's tensors from every rank's rows (None on the
    other ranks)."""
    ckpt, tokenized = _load(path, rollouts, settings.load)
    sized = planned(settings, ckpt.model)  # auto: the statistics pass's plan for this model
    fixed = planned(settings, None)  # auto: the fixed sizes the model modes always had

    def rows(share: list[int]) -> list[int]:
        """The pool's rows of the groups `share`, in the pool's order."""
        return sorted(i for g in share for i in groups[g])

    @functools.cache
    def whole() -> ResponseBatch:
        """The pool's batch, made once: rank 0's merge needs it, and it is a world of one's
        share."""
        return make_batch(tokenized)

    def measured(share: list[int]) -> Rows:
        responses = tokenized.responses
        mine = rows(share)
        if len(mine) == len(responses):  # every row, in the pool's order
            batch = whole()
        else:
            batch = make_batch(replace(tokenized, responses=[responses[i] for i in mine]))
        stats = checkpoint_stats(
            ckpt.model,
            batch,
            batch_tokens=sized.batch_tokens,
            chunk_size=sized.chunk_size,
            progress=bar.update,
        )
        return stats.w, _scores(ckpt, batch, settings, fixed, bar.update, notify)

    def pool(parts: list[Part[int, Rows]]) -> Measured:
        batch = whole()
        w, scores = _rebuilt([(rows(share), part) for share, part in parts], batch.valid.shape)
        return Measured(batch, w, scores, sized)

    return ckpt, shards.run(measured, pool)


@agreed
def _load(path: Path, rollouts: Rollouts, options: LoadOptions) -> tuple[Checkpoint, Rollouts]:
    """The checkpoint at `path` and the whole pool tokenized under it, before the ranks share
    it (every rank; one phase)."""
    ckpt, tokenized, _ = checkpoint_rollouts(path, rollouts, options)
    return ckpt, tokenized


def _scores(
    ckpt: Checkpoint,
    batch: ResponseBatch,
    settings: VarianceSettings,
    fixed: VarianceSettings,
    progress: Callable[[int], object],
    notify: Callable[[str], None] | None,
) -> dict[str, TokenScores]:
    """Each model mode's score vectors over `batch` (proxy's are drawn from w later)."""
    scores = {}
    for mode in settings.modes:
        if mode == "proxy":
            continue
        scores[mode] = token_scores(
            ckpt.model,
            batch,
            mode,
            settings.sketch_dim,
            settings.seed,
            chunk_size=fixed.chunk_size,
            batch_tokens=fixed.batch_tokens,
            force=settings.force,
            progress=progress,
            engine=settings.engine,
            params=settings.params,
            by_block=settings.by_block,
            directions_per_block=settings.directions_per_block,
            budget_s=settings.budget_s,
            on_plan=None if notify is None else (lambda plan: notify(plan.describe())),
        )
    return scores


def _rebuilt(parts: list[tuple[list[int], Rows]], shape: torch.Size) -> Rows:
    """The pool's `shape` `[B, T]` tensors from the ranks' (rows, tensors of those rows): each
    part's row i is the pool's row `rows[i]`, its columns the first ones (its own padding)."""
    if len(parts) == 1:  # one process measured the whole pool: its tensors are the pool's
        return parts[0][1]
    w = torch.zeros(shape)
    assembled = {m: _empty_like(s, shape) for m, s in parts[0][1][1].items()}
    for part_rows, (part_w, part_scores) in parts:
        index = torch.tensor(part_rows, dtype=torch.long)
        width = part_w.shape[1]
        w[index, :width] = part_w
        for m, s in part_scores.items():
            assembled[m].proj[index, :width] = s.proj
            assembled[m].sq_norm[index, :width] = s.sq_norm
            if s.block_sq_norm is not None:
                assembled[m].block_sq_norm[index, :width] = s.block_sq_norm  # type: ignore[index]
    return w, assembled


def _empty_like(scores: TokenScores, shape: torch.Size) -> TokenScores:
    """`scores` (one rank's) with zero tensors of the pool's `[B, T]` shape to fill in."""
    blocks = scores.block_sq_norm
    return replace(
        scores,
        proj=torch.zeros(*shape, scores.proj.shape[-1]),
        sq_norm=torch.zeros(shape),
        block_sq_norm=None if blocks is None else torch.zeros(*shape, blocks.shape[-1]),
    )
