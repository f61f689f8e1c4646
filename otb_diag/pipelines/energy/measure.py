"""The measuring loop of `otb-diag energy`, a chunk of groups at a time, on one process or on
every rank of a torchrun job.

The rollouts are loaded once as a `RolloutStream` (`otb_diag/io/loading.py`: the index, its
chunks of groups, their record), then read a chunk at a time. For each checkpoint (or once,
model-free) and each chunk: the chunk's groups are shared out by tokens
(`otb_diag/runtime/sharded.py:shard`), each share measured as a batch from io
(`otb_diag/io/batches.py:rollouts_batch`), and the shares merged where the runtime gathers them
(`otb_diag/runtime/sharded.py:Shards`, rank 0): put in group order, the chunk's tokens appended
to `tokens.parquet` as one row group (through a temporary file, renamed at the end), the
per-sequence and per-group tables and the proxies' parts accumulated. Row groups follow the
chunks, not the ranks, so one process and N processes write the same file."""

from __future__ import annotations

import contextlib
import math
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from tqdm.auto import tqdm

from otb_diag.errors import InputError
from otb_diag.io.atomic import write_json, write_with
from otb_diag.io.batches import rollouts_batch
from otb_diag.io.checkpoint import Checkpoint, checkpoint_record
from otb_diag.io.loading import CHUNK_TOKENS, RolloutStream, load_rollout_stream
from otb_diag.io.rollouts.probability_checks import CLAMPED_FIELDS
from otb_diag.io.rollouts.readers import Rollouts
from otb_diag.io.rollouts.stream import RolloutIndex
from otb_diag.io.token_file import TokenWriter, read_group
from otb_diag.maths.energy.proxies import combine_proxies
from otb_diag.maths.energy.tables import EnergyTables, energy_tables, pick_group
from otb_diag.maths.energy.token_stats import logged_stats
from otb_diag.maths.estimators.advantages import Estimator
from otb_diag.pipelines.energy.audit import AuditParts, audit_share
from otb_diag.pipelines.energy.settings import EnergySettings
from otb_diag.pipelines.inputs import Say, silent
from otb_diag.pipelines.measure_knobs import planned
from otb_diag.pipelines.results.schema import groups_of_one
from otb_diag.plots import energy as plots
from otb_diag.plots.figure_data import EnergyFigures
from otb_diag.plots.registry import save_figures
from otb_diag.policy.forward_pass import checkpoint_stats
from otb_diag.runtime.sharded import shard
from otb_diag.runtime.torchrun import agreed

# Figure 5 is a hexbin of every generated token up to this many; beyond, an evenly spaced
# subset of this size (every k-th token of the file), so its memory stays flat.
FIG5_MAX_TOKENS = 1_000_000


@dataclass
class StepResult:
    """One checkpoint's (or the model-free pass's) tables, on rank 0."""

    step: int
    checkpoint: dict[str, Any] | None
    vocab_size: int | None
    sequences: pd.DataFrame
    groups: pd.DataFrame
    proxies: dict[str, dict[str, float]]
    tokens: int
    round_trip_issues: int
    fig5_tokens: pd.DataFrame = field(default_factory=pd.DataFrame)
    untemplated_prompts: int = 0  # text prompts tokenized without the chat template
    audit: dict[str, Any] | None = None  # the advantage audit (`audit.py`)
    clamped: dict[str, int] = field(default_factory=dict)  # logged values clamped, its rows


@dataclass
class Measured:
    """What rank 0 hands to the summary."""

    rollouts: RolloutStream
    results: list[StepResult]
    group: str
    tir: bool
    timings: dict[str, float]
    outputs: list[str]
    rank_tokens: list[int]
    clamped: dict[str, int]  # values clamped onto a rule of `io/rollouts/probability_checks.py`
    settings: EnergySettings  # the run's, auto sizes resolved (`measure_knobs.planned`)


@dataclass
class _Part:
    """One rank's share of one chunk."""

    tables: EnergyTables
    rows: int  # the share's responses, empty ones included: the proxies' weight
    round_trip_issues: int
    untemplated_prompts: int
    audit: dict[str, Any] | None
    clamped: dict[str, int]  # the share's logged values clamped (its rows' round-off)


def measure_and_write(
    checkpoints: list[Path],
    rollouts_path: Path,
    out: Path,
    settings: EnergySettings,
    progress: bool,
    say: Say = silent,
) -> Measured | None:
    """Measure every chunk under every checkpoint and write the tables and figures into `out`
    (the shell's staging folder). The chunks' groups are shared out by tokens
    (`otb_diag/runtime/sharded.py:shard`), each share measured where it lies and the shares
    merged and written where the runtime gathers them; None where nothing was gathered. Groups
    of one response are said through `say` once the rollouts are indexed."""
    started = time.perf_counter()
    rollouts = _load_rollouts(rollouts_path, checkpoints, settings)
    index, chunks = rollouts.index, rollouts.chunks
    members = np.bincount(index.row_group, minlength=len(index.group_names))  # [groups]
    warning = groups_of_one(int((members == 1).sum()), len(index.group_names))
    if warning:
        say(warning)
    sized = ([(g, int(index.group_tokens[g])) for g in chunk] for chunk in chunks)
    shards = shard(*sized, what=str(index.path))
    tir = index.tool_output if settings.tir is None else settings.tir
    known = int(index.row_tokens.sum()) if index.has_ids else None
    bar = tqdm(
        total=known * max(1, len(checkpoints)) if known else None,
        unit="tok",
        unit_scale=True,
        desc="energy",
        disable=not progress,
    )
    stride = max(1, math.ceil(int(index.row_tokens.sum()) / FIG5_MAX_TOKENS))
    timings = {"measure_s": 0.0}
    results: list[StepResult] = []  # where the shares are merged; elsewhere none
    with contextlib.ExitStack() as stack:
        writer = TokenWriter(out / "tokens.parquet", stack)
        for i, path in enumerate(checkpoints or [None]):
            ckpt = None if path is None else _load(settings, path)
            # Auto sizes are the first model's: `planned` keeps sizes already resolved.
            settings = planned(settings, None if ckpt is None else ckpt.model)
            t0 = time.perf_counter()
            step = i if ckpt is None or ckpt.step is None else ckpt.step
            # fig5's token sample is kept for the last step only; a step column with several
            last = i == max(0, len(checkpoints) - 1)
            column = step if len(checkpoints) > 1 else None
            acc = _Accumulator(stride if last else 0, index, writer, bar, column)
            stream = rollouts.read(shards.every_round_mine())
            measure = partial(_measure_next, stream, ckpt, settings, tir)
            for r in range(len(chunks)):
                kept = shards.run(measure, acc.take, r)
            timings["measure_s"] += time.perf_counter() - t0
            if kept is not None:
                results.append(kept.result(step, ckpt, settings.load.full_hash))
        bar.close()
        if not results:  # the shares were merged and written elsewhere
            return None
        t0 = time.perf_counter()
        group, outputs = _write_outputs(out, index, chunks, results, writer, settings)
        timings["write_s"] = time.perf_counter() - t0
    timings["total_s"] = time.perf_counter() - started
    clamped = index.clamped if index.clamped is not None else results[-1].clamped
    sizes = shards.sizes
    return Measured(rollouts, results, group, tir, timings, outputs, sizes, clamped, settings)


@agreed
def _load_rollouts(
    rollouts_path: Path, checkpoints: list[Path], settings: EnergySettings
) -> RolloutStream:
    """The indexed rollouts in chunks, once they fit the run (every rank, one phase); every row
    is validated when a chunk is read."""
    rollouts = load_rollout_stream(
        rollouts_path,
        settings.temperature,
        steps=settings.steps,
        reward_columns=list(settings.reward_columns) if settings.reward_columns else None,
        chunk_tokens=CHUNK_TOKENS,
    )
    _check_inputs(rollouts.index, checkpoints, settings.group)
    return rollouts


@agreed
def _load(settings: EnergySettings, path: Path) -> Checkpoint:
    return settings.load.load(path)


def _measure_next(
    stream: Iterator[Rollouts],
    ckpt: Checkpoint | None,
    settings: EnergySettings,
    tir: bool,
    _: list[int],
) -> _Part | None:
    """The next share of `stream` (the groups `Shards.run` hands over), read and measured."""
    return _measure(next(stream), ckpt, settings, tir)


def _write_outputs(
    out: Path,
    index: RolloutIndex,
    chunks: list[list[int]],
    results: list[StepResult],
    writer: TokenWriter,
    settings: EnergySettings,
) -> tuple[str, list[str]]:
    """Rank 0: close tokens.parquet, then the tables and figures of the figures' group (named,
    or picked); returns the group and the files written."""
    group = settings.group if settings.group is not None else pick_group(results[-1].groups)
    writer.close()
    # The figure's group, from its chunk of the last step (the last len(chunks) written).
    position = index.group_names.index(group)
    chunk = next(c for c, groups in enumerate(chunks) if position in groups)
    fig4_tokens = read_group(writer.path, group, writer.chunks[chunk - len(chunks)])
    return group, ["tokens.parquet", *_write_tables(out, results, group, fig4_tokens)]


def _check_inputs(index: RolloutIndex, checkpoints: list[Path], group: str | None) -> None:
    """What the rollouts' index shows the run cannot do, before any chunk is measured: a --group
    the rollouts lack, model-free rows without ids."""
    if group is not None and group not in index.group_names:
        known_groups = ", ".join(index.group_names[:8])
        raise InputError(
            f"no group '{group}' in the rollouts (groups: {known_groups}"
            + (", ...)." if len(index.group_names) > 8 else ")."),
            path=index.path,
            field="group",
        )
    if not checkpoints and not index.has_ids:
        raise InputError(
            "model-free mode needs token ids (prompt_ids, response_ids) on every row; "
            "this file has text only.",
            path=index.path,
            field="response_ids",
            hint="Give --ckpt so its tokenizer can tokenize the text.",
        )


def _measure(
    rollouts: Rollouts, ckpt: Checkpoint | None, settings: EnergySettings, tir: bool
) -> _Part | None:
    """The tables of this rank's share of one chunk (None when the share is empty)."""
    if not rollouts.responses:
        return None
    batch, issues, untemplated = rollouts_batch(rollouts, ckpt, settings.load.chat_template)
    if ckpt is None:
        stats = logged_stats(batch, path=str(rollouts.path))
        token_text: Callable[[list[int]], list[str]] | None = None
    else:
        stats = checkpoint_stats(
            ckpt.model, batch, batch_tokens=settings.batch_tokens, chunk_size=settings.chunk_size
        )
        token_text = ckpt.tokenizer.convert_ids_to_tokens
    tables = energy_tables(
        batch,
        stats,
        settings.baselines,
        estimator=Estimator(settings.handle_zero_tail, tir),
        token_text=token_text,
    )
    audit = audit_share(batch, stats.w, rollouts, settings, tir)
    return _Part(tables, len(tables.sequences), issues, untemplated, audit, rollouts.clamped)


def _merge(parts: list[EnergyTables], index: RolloutIndex) -> EnergyTables:
    """The ranks' tables of one chunk as one, rows in group order (first appearance in the
    file), then sample, then t."""
    position = {name: k for k, name in enumerate(index.group_names)}

    def ordered(frames: list[pd.DataFrame], by_sample: bool) -> pd.DataFrame:
        frame = pd.concat(frames, ignore_index=True) if len(frames) > 1 else frames[0]
        keys = [frame["group"].map(position).to_numpy()]
        if by_sample:
            keys.insert(0, frame["sample"].to_numpy())
        order = np.lexsort(keys)  # stable: t order inside a response is kept
        if (order == np.arange(len(order))).all():
            return frame
        return frame.iloc[order].reset_index(drop=True)

    if len(parts) == 1:
        return parts[0]
    return EnergyTables(
        tokens=ordered([p.tokens for p in parts], True),
        sequences=ordered([p.sequences for p in parts], True),
        groups=ordered([p.groups for p in parts], False),
        proxies={},  # the parts' proxies are combined per step, by `_Accumulator`
    )


class _Accumulator:
    """One step's per-sequence and per-group tables, the proxies' parts and figure 5's tokens,
    chunk by chunk, where the shares are merged; the per-token tables themselves are not kept
    (they are written to `writer`, with a `step` column when `step` is given)."""

    def __init__(
        self, stride: int, index: RolloutIndex, writer: TokenWriter, bar: Any, step: int | None
    ) -> None:
        self.stride = stride  # keep every stride-th token for figure 5; 0: none
        self.index, self.writer, self.bar, self.step = index, writer, bar, step
        self.sequences: list[pd.DataFrame] = []
        self.groups: list[pd.DataFrame] = []
        self.proxies: list[tuple[dict[str, dict[str, float]], int]] = []
        self.fig5: list[pd.DataFrame] = []
        self.tokens = 0
        self.issues = 0
        self.untemplated = 0
        self.clamped: Counter[str] = Counter()
        self.audits = AuditParts()
        self.format = ""

    def take(self, shares: list[tuple[list[int], _Part | None]]) -> _Accumulator:
        """`Shards.run`'s merge of one chunk: the shares' tables in group order, their tokens
        appended to the file, the rest added up; returns itself, now holding the chunk."""
        present = [p for _, p in shares if p is not None]
        merged = _merge([p.tables for p in present], self.index)
        tokens = merged.tokens if self.step is None else merged.tokens.assign(step=self.step)
        self.writer.write(tokens)
        self.add(merged, present, self.index.format)
        self.bar.update(len(merged.tokens))
        return self

    def add(self, merged: EnergyTables, parts: list[_Part], fmt: str) -> None:
        self.format = fmt
        self.audits.add([p.audit for p in parts], merged.sequences)
        self.untemplated += sum(p.untemplated_prompts for p in parts)
        for p in parts:
            self.clamped.update(p.clamped)
        self.sequences.append(merged.sequences)
        self.groups.append(merged.groups)
        self.proxies += [(p.tables.proxies, p.rows) for p in parts]
        self.issues += sum(p.round_trip_issues for p in parts)
        if self.stride:
            n = len(merged.tokens)
            keep = (self.tokens + np.arange(n)) % self.stride == 0
            self.fig5.append(merged.tokens.loc[keep, ["prob", "w", "mask", "temperature"]])
        self.tokens += len(merged.tokens)

    def result(self, step: int, ckpt: Checkpoint | None, full_hash: bool) -> StepResult:
        names = self.proxies[0][0]
        return StepResult(
            step=step,
            checkpoint=checkpoint_record(ckpt, full_hash) if ckpt else None,
            vocab_size=ckpt.vocab_size if ckpt else None,
            sequences=_concat(self.sequences),
            groups=_concat(self.groups),
            proxies={b: combine_proxies([(p[b], n) for p, n in self.proxies]) for b in names},
            tokens=self.tokens,
            round_trip_issues=self.issues,
            fig5_tokens=_concat(self.fig5) if self.fig5 else pd.DataFrame(),
            untemplated_prompts=self.untemplated,
            audit=self.audits.result(self.format),
            clamped={k: self.clamped[k] for k in CLAMPED_FIELDS},
        )


def _concat(frames: list[pd.DataFrame]) -> pd.DataFrame:
    return frames[0] if len(frames) == 1 else pd.concat(frames, ignore_index=True)


def _write_tables(
    out: Path, results: list[StepResult], group: str, fig4_tokens: pd.DataFrame
) -> list[str]:
    """sequences.csv, groups.csv, proxies.json and the figures (tokens.parquet is written)."""

    def stacked(name: str) -> pd.DataFrame:
        """One table over all checkpoints, with a `step` column when there are several."""
        if len(results) == 1:
            return getattr(results[0], name)
        return pd.concat([getattr(r, name).assign(step=r.step) for r in results], ignore_index=True)

    sequences = stacked("sequences")
    write_with(out / "sequences.csv", lambda p: sequences.to_csv(p, index=False))
    groups = stacked("groups")
    write_with(out / "groups.csv", lambda p: groups.to_csv(p, index=False))
    proxies = results[0].proxies if len(results) == 1 else {str(r.step): r.proxies for r in results}
    write_json(out / "proxies.json", proxies)
    files = ["sequences.csv", "groups.csv", "proxies.json"]

    final = results[-1]
    figure_data = EnergyFigures(
        sequences=final.sequences,
        group=group,
        group_tokens=fig4_tokens,
        shown=plots.spread_samples(final.sequences, group, count=8),
        sampled_tokens=final.fig5_tokens,
        vocab_size=final.vocab_size,
        sequences_by_step=sequences if len(results) > 1 else None,
    )
    return files + save_figures("energy", figure_data, out)
