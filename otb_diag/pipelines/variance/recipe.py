"""`otb-diag variance-compare` end to end: per checkpoint, measure the per-token statistics and
score vectors, run the paired-draw variance comparison in each mode, and write the tables and
figures. The maths lives in `maths/variance/` (paired draws, intervals, blocks, fidelity) and the
scores in `policy/scores/token_scores.py` (and the `full` engines it dispatches to)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import pandas as pd
from tqdm.auto import tqdm

from otb_diag.errors import InputError
from otb_diag.io.atomic import staged_output, write_json, write_with
from otb_diag.io.loading import (
    LoadOptions,
    checkpoint_record,
    load_rollouts,
    response_tokens,
    rollouts_record,
)
from otb_diag.io.provenance import library_versions
from otb_diag.maths.estimators.advantages import Estimator
from otb_diag.maths.estimators.registry import baseline_names, get_baseline
from otb_diag.maths.returns import returns_to_go
from otb_diag.maths.variance.blocks import block_tables, projection_error
from otb_diag.maths.variance.knee import noise_table, recommend
from otb_diag.maths.variance.paired_draws import (
    DEFAULT_AGGREGATIONS,
    DEFAULT_GROUP_SIZES,
    default_specs,
    paired_estimates,
    variance_table,
)
from otb_diag.pipelines.variance.measure import fidelity_rows as fidelity_rows_of
from otb_diag.pipelines.variance.measure import full_record, measure
from otb_diag.pipelines.variance.measure import response_tokens_for_balance as balance_size
from otb_diag.pipelines.variance.summary import (
    headline,
    knee_rows,
    paper_claim,
    write_noise,
)
from otb_diag.plots import variance as plots_variance
from otb_diag.plots.style import save_figure
from otb_diag.policy.scores.cost import DEFAULT_BUDGET_S
from otb_diag.policy.scores.token_scores import proxy_scores
from otb_diag.runtime.devices import resolve_device
from otb_diag.runtime.torchrun import Dist, require_groups, session, shard_by_tokens

MODES = ("proxy", "head", "full")
ENGINES = ("auto", "jvp", "vjp")


@dataclass(frozen=True)
class VarianceSettings:
    """Every knob of `otb-diag variance-compare` (the CLI's options, same defaults)."""

    modes: tuple[str, ...] = ("proxy", "head")
    baselines: tuple[str, ...] = field(default_factory=lambda: baseline_names(defaults_only=True))
    aggregations: tuple[str, ...] = DEFAULT_AGGREGATIONS
    group_sizes: tuple[int, ...] = DEFAULT_GROUP_SIZES
    draws: int = 200
    bootstrap: int = 1000
    sketch_dim: int = 256
    seed: int = 0
    force: bool = False
    temperature: float | None = None
    steps: str | None = None  # "A-B": only rollout rows of training steps A to B
    reward_columns: tuple[str, ...] | None = None  # TRL completion logs: columns summed
    batch_tokens: int = 16384
    chunk_size: int = 256
    handle_zero_tail: bool = True
    tir: bool | None = None  # None: on when any response holds tool output (mask 0)
    load: LoadOptions = LoadOptions()
    engine: str = "auto"  # full mode: auto, jvp (forward mode) or vjp (reverse mode)
    params: str | None = None  # full mode: regular expression selecting parameters by name
    by_block: bool = False  # full mode: variance per parameter block (variance_blocks.csv)
    directions_per_block: int | None = None  # default ⌈sketch_dim / blocks⌉
    budget_s: float | None = DEFAULT_BUDGET_S  # full mode refuses longer runs unless force
    prompts_per_step: int | None = None  # the batch the SNR is given at (default: the pool's P)
    current_n: int = 8  # the group size the user trains with: the recommendation's reference

    def check(self) -> None:
        """Raise `InputError` now, before anything is read or written, for a mode, engine or
        budget the run could not honour (the CLI and the API get the same error)."""
        unknown = [m for m in self.modes if m not in MODES]
        if unknown or not self.modes:
            raise InputError(
                f"unknown mode(s) {unknown}; choose from {', '.join(MODES)}", field="mode"
            )
        if self.engine not in ENGINES:
            raise InputError(
                f"unknown engine '{self.engine}'; choose {', '.join(ENGINES)}", field="engine"
            )
        if self.budget_s is not None and not self.budget_s > 0:
            raise InputError(f"budget must be positive, got {self.budget_s} s", field="budget")
        for name in self.baselines:
            get_baseline(name)  # an unknown name stops here, listing the known ones


def run_variance(
    checkpoints: list[Path],
    rollouts_path: Path,
    out: Path,
    settings: VarianceSettings = VarianceSettings(),
    *,
    progress: bool = True,
    notify: Callable[[str], None] | None = None,
) -> dict[str, Any] | None:
    """Write variance.csv, fidelity.csv (variance_blocks.csv with `by_block`), the figures and
    summary.json into `out`. `notify` receives the full-mode cost estimate before the run.

    Under torchrun each rank measures the statistics and score vectors of its share of the
    groups (`shard_by_tokens`); rank 0 gathers them (k floats per token), draws the groups over
    the whole pool with the same seeds as one process, writes, and returns the summary; the other
    ranks return None."""
    settings.check()
    settings.load.check()
    with session(resolve_device(settings.load.device).type) as d:
        if not d.is_main:
            _run(d, checkpoints, rollouts_path, out, settings, progress, notify)
            return None
        with staged_output(out) as stage:
            summary = _run(d, checkpoints, rollouts_path, stage, settings, progress, notify)
            assert summary is not None  # rank 0
            summary["out"] = str(out.resolve())
            write_json(stage / "summary.json", summary)
        return summary


def _run(
    d: Dist,
    checkpoints: list[Path],
    rollouts_path: Path,
    out: Path,
    settings: VarianceSettings,
    progress: bool,
    notify: Callable[[str], None] | None,
) -> dict[str, Any] | None:
    started = time.perf_counter()
    rollouts = d.checked(
        lambda: load_rollouts(
            rollouts_path,
            settings.temperature,
            steps=settings.steps,
            reward_columns=list(settings.reward_columns) if settings.reward_columns else None,
        )
    )
    groups = rollouts.groups()
    d.checked(lambda: require_groups(len(groups), d, str(rollouts_path)))
    sizes = [sum(balance_size(rollouts.responses[i]) for i in idx) for idx in groups.values()]
    share = shard_by_tokens(sizes, d.world_size)[d.rank]
    names = list(groups)
    mine_rows = sorted(i for g in share for i in groups[names[g]])
    mine = replace(rollouts, responses=[rollouts.responses[i] for i in mine_rows])
    rank_tokens = d.all_gather(sum(sizes[g] for g in share))
    model_modes = [m for m in settings.modes if m != "proxy"]
    per_ckpt = (response_tokens(mine) or 0) * (1 + len(model_modes))
    bar = tqdm(
        total=per_ckpt * len(checkpoints) or None,
        unit="tok",
        unit_scale=True,
        desc="variance",
        disable=not (progress and d.is_main),
    )
    tables, fidelity_rows, fidelity_tokens, records, metadata = [], [], [], [], {}
    block_frames, noise_frames, full_info = [], [], {}
    timings: dict[str, float] = {}
    for index, path in enumerate(checkpoints):
        t0 = time.perf_counter()
        ckpt, found = d.checked(lambda p=path: measure(d, p, rollouts, mine, settings, bar, notify))
        step = ckpt.step if ckpt.step is not None else index
        timings[f"measure_s@{step}"] = time.perf_counter() - t0
        if found is None:
            continue
        records.append(checkpoint_record(ckpt, settings.load.full_hash))
        batch = found.batch
        returns = returns_to_go(batch.token_rewards, batch.mask)
        # The same estimator as `energy`: TIR decided on the pool, importance weights as w·ρ².
        estimator = Estimator(settings.handle_zero_tail, settings.tir).resolved(
            batch.mask, batch.valid
        )
        for mode in settings.modes:
            t0 = time.perf_counter()
            energies = {"proxy": found.w}
            if mode == "proxy":
                scores = proxy_scores(found.w, settings.sketch_dim, settings.seed)
            else:
                measured = found.scores[mode]
                scores = measured.proj
                if mode == "full":
                    energies["true"] = measured.sq_norm
                fidelity_rows += fidelity_rows_of(step, mode, found.w, measured, batch.mask)
                keep = batch.mask.bool()
                fidelity_tokens.append(
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
                specs=default_specs(settings.baselines, ["true"] if mode == "full" else []),
                aggregations=settings.aggregations,
                group_sizes=settings.group_sizes,
                draws=settings.draws,
                bootstrap=settings.bootstrap,
                seed=settings.seed,
                mode=mode,
                is_weights=batch.is_weights,
                estimator=estimator,
            )
            tables.append(variance_table(paired).assign(step=step))
            mean_tokens = float(batch.length.double().mean())  # L̄: tokens sampled a response
            noise_frames.append(
                noise_table(paired, mean_tokens, settings.prompts_per_step).assign(step=step)
            )
            metadata[f"{mode}@{step}"] = paired.metadata
            if mode == "full":
                full_info[str(step)] = full_record(
                    measured, projection_error(paired, measured.blocks)
                )
                if settings.by_block:
                    block_frames.append(block_tables(paired, measured.blocks).assign(step=step))
            timings[f"{mode}_s@{step}"] = time.perf_counter() - t0
    bar.close()
    if not d.is_main:
        return None

    variance = pd.concat(tables, ignore_index=True)
    noise = pd.concat(noise_frames, ignore_index=True)
    last_noise = noise[noise["step"] == noise["step"].max()]
    if len(checkpoints) == 1:
        noise = noise.drop(columns="step")
    if len(checkpoints) == 1:
        variance = variance.drop(columns="step")
    fid = pd.DataFrame(fidelity_rows)
    blocks = pd.concat(block_frames, ignore_index=True) if block_frames else None
    if blocks is not None and len(checkpoints) == 1:
        blocks = blocks.drop(columns="step")
    outputs = _write(out, variance, fid, fidelity_tokens, settings, blocks)
    outputs += write_noise(out, noise, last_noise)
    timings["total_s"] = time.perf_counter() - started
    rows = headline(variance)
    return {
        "command": "variance-compare",
        "inputs": {"rollouts": rollouts_record(rollouts), "checkpoints": records},
        "settings": asdict(settings),
        "draws": metadata,
        "headline": rows,
        "paper_claim": paper_claim(rows, int(variance["group_size"].max())),
        "noise_scale": recommend(last_noise, settings.current_n),
        "knee": knee_rows(last_noise),
        "fidelity": fidelity_rows,
        "distributed": {"world_size": d.world_size, "rank_tokens": rank_tokens},
        "full": full_info,
        "timings": timings,
        "versions": library_versions(),
        "outputs": [*outputs, "summary.json"],
    }


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
    figures = {}
    for mode in settings.modes:
        rows = final[final["mode"] == mode]
        figures[f"variance_vs_n_{mode}"] = plots_variance.fig_variance_vs_group_size(
            rows, aggregation=settings.aggregations[0]
        )
        figures[f"ratio_to_mean_{mode}"] = plots_variance.fig_ratio_to_mean(
            rows, aggregation=settings.aggregations[0]
        )
    if fidelity_tokens:
        tokens = pd.concat(fidelity_tokens, ignore_index=True)
        last = tokens[tokens["step"] == tokens["step"].max()]
        exact = "full" if (last["mode"] == "full").any() else "head"
        figures["proxy_fidelity"] = plots_variance.fig_proxy_fidelity(last[last["mode"] == exact])
    if blocks is not None:
        last = blocks if "step" not in blocks else blocks[blocks["step"] == blocks["step"].max()]
        figures["variance_by_block"] = plots_variance.fig_variance_by_block(
            last, aggregation=settings.aggregations[0]
        )
    for name, fig in figures.items():
        files += [p.name for p in save_figure(fig, out, name)]
    return files
