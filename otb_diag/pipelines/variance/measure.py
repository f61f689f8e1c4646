"""One checkpoint's measurements for `otb-diag variance-compare`: per-token statistics and the
score vectors of each model mode, measured by each rank on its share of the groups and assembled
over the whole pool on rank 0."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from otb_diag.io.batches import checkpoint_batch
from otb_diag.io.checkpoint import Checkpoint
from otb_diag.io.rollouts.readers import Rollouts
from otb_diag.io.rollouts.to_batch import make_batch
from otb_diag.io.rollouts.tokenize import tokenize_rollouts
from otb_diag.maths.response_batch import ResponseBatch
from otb_diag.pipelines.measure_knobs import planned
from otb_diag.policy.forward_pass import checkpoint_stats
from otb_diag.policy.scores.token_scores import TokenScores, token_scores
from otb_diag.runtime.torchrun import Dist, agreed


@dataclass
class Measured:
    """One checkpoint's measurements over the whole pool (rank 0)."""

    batch: ResponseBatch
    w: Tensor  # [B, T]
    scores: dict[str, TokenScores]  # model mode -> its scores over the pool
    settings: Any  # the settings, auto sizes as the statistics pass resolved them (`planned`)


@agreed
def measure(
    d: Dist,
    path: Path,
    rollouts: Rollouts,
    mine: Rollouts,
    settings: Any,
    bar: Any,
    notify: Callable[[str], None] | None,
) -> tuple[Checkpoint, Measured | None]:
    """This rank's share (`mine`) measured under the checkpoint at `path`, assembled on rank 0
    (None on the other ranks); `settings` is a `VarianceSettings`. One phase: a failure on any
    rank stops every rank with it."""
    ckpt, batch, _ = checkpoint_batch(path, mine, settings.load)
    sized = planned(settings, ckpt.model)  # auto: the statistics pass's plan for this model
    fixed = planned(settings, None)  # auto: the fixed sizes the model modes always had
    stats = checkpoint_stats(
        ckpt.model,
        batch,
        batch_tokens=sized.batch_tokens,
        chunk_size=sized.chunk_size,
        progress=bar.update,
    )
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
            progress=bar.update,
            engine=settings.engine,
            params=settings.params,
            by_block=settings.by_block,
            directions_per_block=settings.directions_per_block,
            budget_s=settings.budget_s,
            on_plan=None if notify is None else (lambda plan: notify(plan.describe())),
        )
    if d.world_size == 1:
        return ckpt, Measured(batch, stats.w, scores, sized)
    keys = [(r.group, r.sample) for r in mine.responses]
    parts = d.gather((keys, stats.w, scores))
    if parts is None:
        return ckpt, None
    tokenized, _ = tokenize_rollouts(
        rollouts, ckpt.tokenizer, chat_template=settings.load.chat_template
    )
    full = make_batch(tokenized)
    row = {(r.group, r.sample): i for i, r in enumerate(rollouts.responses)}
    w = torch.zeros(full.valid.shape)
    assembled = {m: _empty_like(s, full.valid.shape) for m, s in scores.items()}
    for part_keys, part_w, part_scores in parts:
        rows = torch.tensor([row[k] for k in part_keys], dtype=torch.long)
        width = part_w.shape[1]
        w[rows, :width] = part_w
        for m, s in part_scores.items():
            assembled[m].proj[rows, :width] = s.proj
            assembled[m].sq_norm[rows, :width] = s.sq_norm
            if s.block_sq_norm is not None:
                assembled[m].block_sq_norm[rows, :width] = s.block_sq_norm  # type: ignore[index]
    return ckpt, Measured(full, w, assembled, sized)


def _empty_like(scores: TokenScores, shape: torch.Size) -> TokenScores:
    """`scores` (one rank's) with zero tensors of the pool's `[B, T]` shape to fill in."""
    blocks = scores.block_sq_norm
    return replace(
        scores,
        proj=torch.zeros(*shape, scores.proj.shape[-1]),
        sq_norm=torch.zeros(shape),
        block_sq_norm=None if blocks is None else torch.zeros(*shape, blocks.shape[-1]),
    )
