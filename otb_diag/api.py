"""The Python face of otb-diag: what a notebook or a trainer callback calls, in the order a
measurement runs (read, load, tokenize, measure, compare, watch). `import otb_diag` exposes
the names of its `__all__` from here (lazily, so `import otb_diag` stays cheap); everything else
is internal and may move.

    rollouts = read_rollouts("rollouts.jsonl")
    ckpt = load_checkpoint("checkpoint-200")
    batch = response_batch(rollouts, ckpt)         # [B, T] tensors of the response tokens
    stats = token_statistics(ckpt, batch)          # logprob, prob, sum_pi2, entropy, w, h_sq
    adv = advantages(batch, stats, "otb")          # [B, T] under any registry baseline
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pandas as pd
from torch import Tensor

from otb_diag.dynamics.collapse import DetectionRule as DetectionRule  # re-exported
from otb_diag.dynamics.collapse import RunDynamics, analyse_run
from otb_diag.io.checkpoint import Checkpoint
from otb_diag.io.checkpoint import load_checkpoint as load_checkpoint  # re-exported
from otb_diag.io.loading import load_rollouts
from otb_diag.io.rollouts.readers import Rollouts
from otb_diag.io.rollouts.to_batch import make_batch
from otb_diag.io.rollouts.tokenize import check_vocab, tokenize_rollouts
from otb_diag.io.scenarios import default_checkpoint, default_rollouts
from otb_diag.io.training_logs import read_training_log as read_training_log  # re-exported
from otb_diag.maths.energy.tables import energy_tables as energy_tables  # re-exported
from otb_diag.maths.energy.token_stats import TokenStats
from otb_diag.maths.estimators.advantages import Estimator, batch_advantages
from otb_diag.maths.estimators.registry import baseline_names as _registry_names
from otb_diag.maths.estimators.registry import (
    register_baseline as register_baseline,  # re-exported
)
from otb_diag.maths.response_batch import ResponseBatch
from otb_diag.pipelines.energy.settings import EnergySettings
from otb_diag.pipelines.inputs import Inputs
from otb_diag.pipelines.results.variance import VarianceResult
from otb_diag.pipelines.variance.recipe import VarianceSettings, run_variance
from otb_diag.policy.forward_pass import checkpoint_stats


def embedded_default(scenario: str = "default") -> tuple[Path, Path]:
    """(final checkpoint directory, rollouts file) of a toy lab shipped with the package:
    `default` (short copy/reverse/sort responses) or `long` (running sums, 20–400 tokens)."""
    return default_checkpoint(scenario), default_rollouts(scenario)


def read_rollouts(path: str | Path, *, temperature: float | None = None) -> Rollouts:
    """Read and validate a rollouts file (JSONL, Parquet or a verl dump; see the README's
    "Rollout format"). `temperature`, when given, overrides every row's τ. Bad rows raise
    `InputError` naming the file, line or row and field."""
    return load_rollouts(Path(path), temperature)


def response_batch(rollouts: Rollouts, checkpoint: Checkpoint | None = None) -> ResponseBatch:
    """The rollouts as `[B, T]` tensors over the response tokens (row i = response i in file
    order, T = longest response). Text is tokenized with the checkpoint's tokenizer and every id
    checked against its vocabulary; without a checkpoint the rows must carry ids."""
    if checkpoint is not None:
        rollouts, _ = tokenize_rollouts(rollouts, checkpoint.tokenizer)
        check_vocab(rollouts, checkpoint.vocab_size)
    return make_batch(rollouts)


def token_statistics(
    checkpoint: Checkpoint,
    batch: ResponseBatch,
    *,
    batch_tokens: int = EnergySettings.batch_tokens,
    chunk_size: int = EnergySettings.chunk_size,
) -> TokenStats:
    """Per-token statistics under the checkpoint, each `[B, T]` fp32 (docs/theory.md §2): `logprob`
    log p_t, `prob`, `sum_pi2` Σ_v π_t(v)², `entropy`, the logit-gradient proxy
    `w = (1 − 2p_t + sum_pi2)/τ²` and `h_sq = ‖h_t‖²`; 0 on padding. The `[B, T, V]` logits never
    exist: at most `chunk_size` positions' logits at once."""
    return checkpoint_stats(
        checkpoint.model, batch, batch_tokens=batch_tokens, chunk_size=chunk_size
    )


def baseline_names(*, defaults_only: bool = False) -> list[str]:
    """Names the baseline registry knows, in registration order (`register_baseline` adds one);
    `defaults_only`: those `energy` and `variance-compare` measure when not told otherwise."""
    return list(_registry_names(defaults_only=defaults_only))


def advantages(
    batch: ResponseBatch,
    stats: TokenStats,
    baseline: str = "otb",
    *,
    handle_zero_tail: bool = True,
    tir: bool | None = None,
    eps: float | None = None,
) -> Tensor:
    """`[B, T]` token advantages `(G_t − B_t) · mask_t` under a registry baseline, computed by
    the estimator every command uses: returns `G_t = Σ_{k≥t} r_k`, realized energy
    `W_t = Σ_{j≤t} mask_j·w_j` of `stats` (w·ρ² with the rollouts' importance weights), verl's
    zero tail, and the TIR re-indexing when a response holds tool output (`tir=None`); `eps`
    overrides the baseline's own ε."""
    estimator = Estimator(handle_zero_tail, tir, eps)
    return batch_advantages(batch, stats.w, [baseline], estimator).by_baseline[baseline]


def variance_compare(
    checkpoint: str | Path,
    rollouts: str | Path,
    out: str | Path,
    **settings: Any,
) -> VarianceResult | None:
    """Run `otb-diag variance-compare` and return its result (`signal`: the groups whose rewards
    carry one; `headline`: OTB's ratio to mean, mean-equivalent N′ and token saving per mode,
    each with its 95 % interval; `paper_claim`: the paper's headline read at equal gradient
    variance, beside its own > 65 % at equal score, each verdict "holds", "does not hold", "not
    resolved" or "no signal"; `to_json()`: its summary.json; None on a torchrun rank but 0).
    Writes variance.csv, fidelity.csv, figures and summary.json into `out` (summary.json alone
    where no group's rewards carry a signal). `settings` are `VarianceSettings` fields, e.g.
    `modes=("proxy", "head")`, `group_sizes=(2, 4, 8)`, `draws=200`, `seed=0`."""
    return run_variance(
        Inputs(ckpt=[Path(checkpoint)], rollouts=Path(rollouts)),
        Path(out),
        replace(VarianceSettings(), **settings),
        progress=False,
    )


def detect_collapse(
    log: str | Path | pd.DataFrame, rule: DetectionRule | None = None, target: float | None = None
) -> RunDynamics:
    """Apply the collapse rule (docs/theory.md §5) to one run: a training log's path (our
    metrics.jsonl, verl JSONL/CSV, a TRL trainer_state.json) or its tidy table
    (`read_training_log(path).frame`). Returns the collapse step, the variance warning step,
    the lead time, and tokens to `target` score."""
    frame = log if isinstance(log, pd.DataFrame) else read_training_log(log).frame
    return analyse_run(frame, rule or DetectionRule(), target)
