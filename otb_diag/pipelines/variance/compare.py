"""`otb-diag variance-compare`'s measurement, once the rollouts carry a signal (`recipe.py`
decides first): per checkpoint, the per-token statistics and score vectors, the paired-draw
variance comparison in each mode, and the tables, figures and summary. The maths lives in
`maths/variance/` (paired draws, intervals, blocks, fidelity) and the scores in
`policy/scores/token_scores.py` (and the `full` engines it dispatches to). Its modules (the
model's, the scores', the plots') take seconds to import, which a run with nothing to compare
does not spend."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
from tqdm.auto import tqdm

from otb_diag.io.atomic import write_with
from otb_diag.io.checkpoint import checkpoint_record
from otb_diag.io.loading import RolloutSet
from otb_diag.io.provenance import library_versions
from otb_diag.maths.estimators.advantages import Estimator
from otb_diag.maths.estimators.registry import TRUE_ENERGIES
from otb_diag.maths.noise.knee import noise_table, recommend
from otb_diag.maths.returns import returns_to_go
from otb_diag.maths.variance.blocks import block_tables, projection_error
from otb_diag.maths.variance.paired_draws import (
    default_specs,
    paired_estimates,
    variance_table,
)
from otb_diag.maths.variance.score_energies import score_energies
from otb_diag.maths.variance.zero_tail import zero_tail_rows
from otb_diag.pipelines.results.schema import Distributed, RewardSignal, RunInputs, build
from otb_diag.pipelines.results.variance import (
    Draws,
    FidelityRow,
    FullMode,
    Recommendation,
    VarianceResult,
    ZeroTailRow,
)
from otb_diag.pipelines.shell import Stage
from otb_diag.pipelines.variance.conclusions import (
    fidelity_rows,
    full_record,
    knee_rows,
    verdicts,
    write_noise,
)
from otb_diag.pipelines.variance.evidence import mode_intervals
from otb_diag.pipelines.variance.measure import Measured, measure
from otb_diag.pipelines.variance.settings import VarianceSettings
from otb_diag.plots.figure_data import VarianceFigures
from otb_diag.plots.registry import save_figures
from otb_diag.policy.scores.token_scores import proxy_scores
from otb_diag.runtime.sharded import Shards


def compare(
    checkpoints: list[Path],
    loaded: RolloutSet,
    signal: RewardSignal,
    shards: Shards[int],
    out: Path,
    stage: Stage,
    settings: VarianceSettings,
    started: float,
) -> VarianceResult | None:
    """Per checkpoint: measure this rank's share of the groups (`shards`; the pool's on rank
    0), then in each mode draw the groups over the whole pool and accumulate the tables; rank 0
    writes and summarises (the other ranks return None)."""
    groups = list(loaded.groups.values())
    sizes = [sum(loaded.sizes[i] for i in rows) for rows in groups]  # whole groups, by tokens
    mine = [loaded.rollouts.responses[i] for g in shards.mine() for i in groups[g]]
    model_modes = [m for m in settings.modes if m != "proxy"]
    # The bar counts tokens: known before the run only when every row of the share has ids.
    tokenized = all(r.response_ids is not None for r in mine)
    my_tokens = sum(sizes[g] for g in shards.mine())
    per_ckpt = (my_tokens if tokenized else 0) * (1 + len(model_modes))
    bar = tqdm(
        total=per_ckpt * len(checkpoints) or None,
        unit="tok",
        unit_scale=True,
        desc="variance",
        disable=not stage.progress,
    )
    notify = stage.say if stage.progress else None
    tables, recorded, pooled = _Tables(), settings, False
    for index, path in enumerate(checkpoints):
        t0 = time.perf_counter()
        ckpt, found = measure(path, loaded.rollouts, groups, shards, settings, bar, notify)
        step = ckpt.step if ckpt.step is not None else index
        tables.timings[f"measure_s@{step}"] = time.perf_counter() - t0
        if found is not None:  # the pool's measurements: rank 0's
            pooled, recorded = True, found.settings  # auto sizes: the last checkpoint's plan
            tables.checkpoints.append(checkpoint_record(ckpt, settings.load.full_hash))
            _compare_modes(tables, step, found, settings)
    bar.close()
    if not pooled:  # the other ranks: their shares were merged on rank 0
        return None
    return _summary(
        tables, out, stage, loaded, signal, recorded, len(checkpoints), started, shards.sizes
    )


@dataclass
class _Tables:
    """What the checkpoint × mode loop accumulates on rank 0, one entry per (checkpoint, mode)."""

    variance: list[pd.DataFrame] = field(default_factory=list)
    noise: list[pd.DataFrame] = field(default_factory=list)
    blocks: list[pd.DataFrame] = field(default_factory=list)
    fidelity_rows: list[dict[str, Any]] = field(default_factory=list)
    fidelity_tokens: list[pd.DataFrame] = field(default_factory=list)
    checkpoints: list[dict[str, Any]] = field(default_factory=list)
    draws: dict[str, Any] = field(default_factory=dict)  # "mode@step" -> paired-draw metadata
    full: dict[str, Any] = field(default_factory=dict)  # step -> full-mode record
    zero_tail: list[dict[str, Any]] = field(default_factory=list)  # maths/variance/zero_tail.py
    timings: dict[str, float] = field(default_factory=dict)


def _compare_modes(tables: _Tables, step: int, found: Measured, settings: VarianceSettings) -> None:
    """The paired-draw comparison of every mode on one checkpoint's measurements, into `tables`."""
    batch = found.batch
    returns = returns_to_go(batch.token_rewards, batch.mask)
    # The same estimator as `energy`: TIR decided on the pool, importance weights as w·ρ².
    estimator = Estimator(settings.handle_zero_tail, settings.tir).resolved(batch.mask, batch.valid)
    for mode in settings.modes:
        t0 = time.perf_counter()
        energies = {"proxy": found.w}
        if mode == "proxy":
            scores = proxy_scores(found.w, settings.sketch_dim, settings.seed)
        else:
            measured = found.scores[mode]
            scores = measured.proj
            if mode == "full":  # per-token ‖s_t‖² and the sequence's ‖Σ_t s_t‖²
                energies |= score_energies(
                    measured.proj, measured.sq_norm, batch.mask, batch.is_weights
                )
            tables.fidelity_rows += fidelity_rows(step, mode, found.w, measured, batch.mask)
            keep = batch.mask.bool()
            tables.fidelity_tokens.append(
                pd.DataFrame(
                    {
                        "step": step,
                        "mode": mode,
                        "w": found.w[keep].numpy(),
                        "true_sq_norm": measured.sq_norm[keep].numpy(),
                    }
                )
            )
        paired = paired_estimates(
            returns,
            batch.mask,
            batch.group,
            scores,
            energies,
            specs=default_specs(
                settings.baselines,
                list(TRUE_ENERGIES) if mode == "full" else [],
                settings.zero_tail_split,
            ),
            aggregations=settings.aggregations,
            group_sizes=settings.group_sizes,
            draws=settings.draws,
            bootstrap=settings.bootstrap,
            seed=settings.seed,
            mode=mode,
            is_weights=batch.is_weights,
            estimator=estimator,
        )
        tables.variance.append(variance_table(paired).assign(step=step))
        if settings.zero_tail_split:
            aggregation = settings.aggregations[0]
            tables.zero_tail += [
                {"step": step, "mode": mode, "aggregation": aggregation, **row}
                for row in zero_tail_rows(paired, aggregation)
            ]
        mean_tokens = float(batch.length.double().mean())  # L̄: tokens sampled a response
        tables.noise.append(
            noise_table(paired, mean_tokens, settings.prompts_per_step).assign(step=step)
        )
        tables.draws[f"{mode}@{step}"] = paired.metadata
        if mode == "full":
            tables.full[str(step)] = full_record(
                measured, projection_error(paired, measured.blocks)
            )
            if settings.by_block:
                tables.blocks.append(block_tables(paired, measured.blocks).assign(step=step))
        tables.timings[f"{mode}_s@{step}"] = time.perf_counter() - t0


def _summary(
    tables: _Tables,
    out: Path,
    stage: Stage,
    loaded: RolloutSet,
    signal: RewardSignal,
    settings: VarianceSettings,
    n_checkpoints: int,
    started: float,
    rank_tokens: list[int],
) -> VarianceResult:
    """Rank 0: the tables concatenated (a `step` column only with several checkpoints), every
    file written into the stage (moved into `out` with summary.json), and the result
    (summary.json's content)."""
    into = stage.into
    assert into is not None  # variance-compare writes a folder

    def stacked(frames: list[pd.DataFrame]) -> pd.DataFrame:
        table = pd.concat(frames, ignore_index=True)
        return table.drop(columns="step") if n_checkpoints == 1 else table

    variance = stacked(tables.variance)
    noise = pd.concat(tables.noise, ignore_index=True)
    last_noise = noise[noise["step"] == noise["step"].max()]
    noise = noise.drop(columns="step") if n_checkpoints == 1 else noise
    fid = pd.DataFrame(tables.fidelity_rows)
    blocks = stacked(tables.blocks) if tables.blocks else None
    noise_files = write_noise(into, noise, last_noise)
    knee = knee_rows(last_noise)
    rows, claims = verdicts(variance, settings)  # before the figures, which draw its intervals
    outputs = _write(into, variance, fid, tables.fidelity_tokens, settings, blocks) + noise_files
    if tables.zero_tail:
        zero_tail = pd.DataFrame(tables.zero_tail)
        write_with(into / "zero_tail.csv", lambda p: zero_tail.to_csv(p, index=False))
        outputs.append("zero_tail.csv")
    tables.timings["total_s"] = time.perf_counter() - started
    return VarianceResult(
        inputs=RunInputs.of(loaded.record, tables.checkpoints),
        settings=settings,
        signal=signal,
        draws=build(dict[str, Draws], tables.draws),
        headline=rows,
        paper_claim=claims,
        noise_scale=build(Recommendation, recommend(last_noise, settings.current_n)),
        knee=knee,
        fidelity=build(list[FidelityRow], tables.fidelity_rows),
        distributed=Distributed(len(rank_tokens), rank_tokens),
        full=build(dict[str, FullMode], tables.full),
        zero_tail=[ZeroTailRow(**row) for row in tables.zero_tail],
        timings=tables.timings,
        versions=library_versions(),
        outputs=[*outputs, "summary.json"],
        out=str(out.resolve()),
    )


def _write(
    out: Path,
    variance: pd.DataFrame,
    fid: pd.DataFrame,
    fidelity_tokens: list[pd.DataFrame],
    settings: VarianceSettings,
    blocks: pd.DataFrame | None,
) -> list[str]:
    out.mkdir(parents=True, exist_ok=True)
    write_with(out / "variance.csv", lambda p: variance.to_csv(p, index=False))
    write_with(out / "fidelity.csv", lambda p: fid.to_csv(p, index=False))
    files = ["variance.csv", "fidelity.csv"]
    if blocks is not None:
        write_with(out / "variance_blocks.csv", lambda p: blocks.to_csv(p, index=False))
        files.append("variance_blocks.csv")
    final = (
        variance if "step" not in variance else variance[variance["step"] == variance["step"].max()]
    )
    aggregation = settings.aggregations[0]
    for mode in settings.modes:
        # the figures draw the intervals the verdicts read (evidence.py), of the rows they show
        shown = final[(final["mode"] == mode) & (final["aggregation"] == aggregation)]
        rows = mode_intervals(shown, mode, settings.sketch_dim)
        data = VarianceFigures(aggregation, variance_rows=rows)
        files += save_figures("variance-compare", data, out, mode)
    exact_tokens, last_blocks = None, None
    if fidelity_tokens:
        tokens = pd.concat(fidelity_tokens, ignore_index=True)
        last = tokens[tokens["step"] == tokens["step"].max()]
        exact = "full" if (last["mode"] == "full").any() else "head"
        exact_tokens = last[last["mode"] == exact]
    if blocks is not None:
        last_blocks = (
            blocks if "step" not in blocks else blocks[blocks["step"] == blocks["step"].max()]
        )
    figure_data = VarianceFigures(aggregation, fidelity_tokens=exact_tokens, block_rows=last_blocks)
    return files + save_figures("variance-compare", figure_data, out)
