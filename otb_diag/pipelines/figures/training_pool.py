"""Several `otb-diag train` runs at once (`figures`' trainings and learning-rate sweep), in
worker processes when `jobs` > 1.

Each worker runs with one torch thread whatever `jobs` is, so a run's numbers do not depend on
how many ran beside it (float sums are ordered by the thread count); with `jobs` = 1 the runs go
one after another in this process, also on one thread."""

from __future__ import annotations

import multiprocessing
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from otb_diag.pipelines.results.train import TrainResult
from otb_diag.pipelines.rl_training import TrainSettings, train
from otb_diag.runtime.threads import torch_threads


@dataclass(frozen=True)
class TrainingJob:
    """One training: start checkpoint, output directory, settings and its label in figures."""

    ckpt: Path
    out: Path
    settings: TrainSettings
    label: str


def _run_one(job: TrainingJob, progress: bool) -> TrainResult:
    with torch_threads(1):
        return train(job.ckpt, job.out, job.settings, progress=progress)


def run_trainings(jobs: list[TrainingJob], workers: int, progress: bool) -> list[TrainResult]:
    """Run every job; returns their results (`train.json`) in `jobs`' order. Progress bars are
    drawn only in this process (one job at a time)."""
    if workers <= 1 or len(jobs) == 1:
        return [_run_one(job, progress) for job in jobs]
    # spawn: a forked torch process can deadlock in its thread pool.
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=min(workers, len(jobs)), mp_context=context) as pool:
        futures = [pool.submit(_run_one, job, False) for job in jobs]
        return [f.result() for f in futures]
