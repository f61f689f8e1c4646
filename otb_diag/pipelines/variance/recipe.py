"""`otb-diag variance-compare` end to end: read the rollouts and, where their rewards carry a
signal, per checkpoint measure the per-token statistics and score vectors, run the paired-draw
variance comparison in each mode, and write the tables and figures (`compare.py`). Where no
group's rewards differ, every baseline's advantages are zero: the run says so first, loads no
model and writes only summary.json, every verdict "no signal"."""

from __future__ import annotations

import time
from pathlib import Path

from otb_diag.errors import InputError
from otb_diag.io.loading import RolloutSet, load_rollout_set
from otb_diag.io.provenance import library_versions
from otb_diag.knobs import joined
from otb_diag.maths.noise.knee import no_signal
from otb_diag.pipelines.inputs import Inputs, Say, silent
from otb_diag.pipelines.results.schema import (
    Distributed,
    RewardSignal,
    RunInputs,
    build,
    groups_of_one,
)
from otb_diag.pipelines.results.variance import ClaimVerdict, Recommendation, VarianceResult
from otb_diag.pipelines.shell import Stage, run_recipe
from otb_diag.pipelines.variance.settings import VarianceSettings as VarianceSettings
from otb_diag.runtime.sharded import shard
from otb_diag.runtime.torchrun import agreed


def run_variance(
    inputs: Inputs,
    out: Path,
    settings: VarianceSettings = VarianceSettings(),
    *,
    progress: bool = True,
    say: Say = silent,
) -> VarianceResult | None:
    """Compare the baselines' gradient variance on the rollouts of `inputs` under each of its
    checkpoints (an omitted --ckpt or --rollouts is the scenario's, said through `say`); write
    variance.csv, fidelity.csv (variance_blocks.csv with `by_block`), the figures and
    summary.json (the result's `to_json()`) into `out`. With `progress`, `say` also receives
    the full-mode cost estimate before the run (news, like the progress bar). Where no group's
    rewards carry a signal (`RewardSignal`), nothing is measured: summary.json alone, every
    verdict "no signal".

    Under torchrun each rank measures the statistics and score vectors of its share of the
    groups (`shard_by_tokens`); rank 0 gathers them (k floats per token), draws the groups over
    the whole pool with the same seeds as one process, writes, and returns the result; the other
    ranks return None."""
    settings.check()  # before a default file is looked up (each knob's when it was built)
    rollouts_path = inputs.rollouts_path(say)
    checkpoints = inputs.checkpoint_dirs(say)
    return run_recipe(
        lambda stage: _run(checkpoints, rollouts_path, out, stage, settings),
        out=out,
        load=settings.load,
        progress=progress,
        say=say,
    )


def _run(
    checkpoints: list[Path],
    rollouts_path: Path,
    out: Path,
    stage: Stage,
    settings: VarianceSettings,
) -> VarianceResult | None:
    """Read the rollouts and split their groups over the ranks; where some group's rewards
    carry a signal, measure and compare (`compare.py`), else the no-signal result (the result's
    summary opens with the share of the groups that carry one, when not all do)."""
    started = time.perf_counter()
    loaded = _load(rollouts_path, settings)
    check_pools(loaded, settings, stage.say)  # before any forward pass
    sizes = [sum(loaded.sizes[i] for i in rows) for rows in loaded.groups.values()]
    shards = shard(list(enumerate(sizes)), what=str(rollouts_path))  # whole groups, by tokens
    signal = RewardSignal.of(loaded.with_signal)
    if not signal.carries_any:  # nothing a baseline could change: no model, no measurement
        return _no_signal(loaded, signal, out, settings, started, len(shards.sizes))
    from otb_diag.pipelines.variance.compare import compare  # seconds of imports: see there

    return compare(checkpoints, loaded, signal, shards, out, stage, settings, started)


def _no_signal(
    loaded: RolloutSet,
    signal: RewardSignal,
    out: Path,
    settings: VarianceSettings,
    started: float,
    world_size: int,
) -> VarianceResult:
    """The result of a run whose rewards carry no signal: every verdict "no signal" (the paper's
    claim in each mode, the knee), no table and no figure, only summary.json (written by the
    recipe shell on rank 0; every rank reaches the same verdict from the same rollouts)."""
    return VarianceResult(
        inputs=RunInputs.of(loaded.record, []),
        settings=settings,
        signal=signal,
        draws={},
        headline=[],
        paper_claim=[ClaimVerdict.no_signal(mode) for mode in settings.modes],
        noise_scale=build(Recommendation, no_signal()),
        knee=None,
        fidelity=[],
        distributed=Distributed(world_size, [0] * world_size),  # no token measured
        full={},
        timings={"total_s": time.perf_counter() - started},
        versions=library_versions(),
        outputs=["summary.json"],
        out=str(out.resolve()),
    )


def check_pools(loaded: RolloutSet, settings: VarianceSettings, say: Say) -> None:
    """The group sizes against the pools just read, before any model runs: N is drawn from each
    prompt's pool of M responses and must be at most M/2 of the smallest (`usable_group_sizes`
    keeps those). A size given that the pools cannot honour is an `InputError`; the default's
    sizes above it are left out, said through `say`. Groups of one are said too (the pools
    give a group baseline nothing to compare; the sizes' error follows)."""
    from otb_diag.maths.variance.paired_draws import DEFAULT_GROUP_SIZES

    pools = [len(rows) for rows in loaded.groups.values()]
    smallest = min(pools)
    warning = groups_of_one(sum(m == 1 for m in pools), len(pools))
    if warning:
        say(warning)
    over = [n for n in settings.group_sizes if n > smallest // 2]
    if not over:
        return
    group = next(name for name, rows in loaded.groups.items() if len(rows) == smallest)
    where = (
        f"half the smallest pool (group {group} holds M = {smallest} responses, so N ≤ "
        f"{smallest // 2}: the draws of N from M stay varied)"
    )
    if settings.group_sizes != DEFAULT_GROUP_SIZES or len(over) == len(settings.group_sizes):
        raise InputError(
            f"--group-sizes: {joined(over)} {'is' if len(over) == 1 else 'are'} above {where}",
            hint="Sample larger pools (rollouts sample --n), or ask for smaller groups.",
        )
    say(f"note: the default group sizes {joined(over)} are left out: above {where}")


@agreed
def _load(rollouts_path: Path, settings: VarianceSettings) -> RolloutSet:
    return load_rollout_set(
        rollouts_path,
        settings.temperature,
        steps=settings.steps,
        reward_columns=list(settings.reward_columns) if settings.reward_columns else None,
    )
