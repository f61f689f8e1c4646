"""The trainer-neutral core of the live diagnostics: one step's rows in, its `otb/` metrics out.

Every live adapter (TRL's `attach`, verl's `BudgetTracker`, a plain PyTorch loop:
tests/integrations/plain_loop.py) translates its trainer's hooks, rows, groups and logger,
and hands each measured step to one `LiveCore`, which holds everything else:

    gather(step, rows)             every process's rows of the step, in process order (one
                                   collective; `[rows()]` on one process), or None where the
                                   diagnostics stop (below)
    measure(batch, step, scores)   the step's metrics (`step_metrics.py:step_and_split_metrics`:
                                   energy, proxies, audit, and the split where scores are
                                   given) and its dump; pure but for the dump
    submit(batch, step, scores)    `measure` in the core's worker process (`worker.py`), beside
    collect(pooled_too)            the trainer's backward pass and optimizer step and off its
                                   interpreter; `collect`, at the step's end, waits for it and
                                   `finish`es the step
    finish(step, metrics)          the collapse watch (`collapse_watch.py`), the split pooled
                                   over the steps (`maths/noise/budget_stream.py`), the
                                   full record (`metric_levels.py:FullRecord`); every metric
    logged(metrics)                what the dashboard gets at the run's level (`metric_levels`)
    add_grad_norm(step, value)     the trainer's gradient norm, for the collapse watch
    guard(step, fn, ...)           `fn`, an error in it said once (`fail`) instead of raised

With several processes, each collects its rows of the step and every one calls `gather` at the
same point of the step; the main process measures the whole step and writes its dump. The
diagnostics stop at an error (`fail`: said once, naming the step and the process), never the
training: on one process at once; with several, the failing process hands its error over at the
next gather, where every process stops together (one that stopped alone would leave the others
waiting at the gather).

Its memory is the same whatever the run's length: the watch's windows, the pools' window of step
tuples and moments, the last step's metrics, one step's rows and metrics in flight.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, TypeVar

from torch import Tensor

from otb_diag.integrations.core.collapse_watch import CollapseWatch
from otb_diag.integrations.core.controller import KneeController
from otb_diag.integrations.core.dump import dump_step
from otb_diag.integrations.core.metric_levels import FullRecord, logged_at
from otb_diag.integrations.core.step_metrics import PREFIX, split_baselines, step_and_split_metrics
from otb_diag.integrations.core.worker import Worker, describe, shared_worker
from otb_diag.maths.aggregation import AGGREGATIONS
from otb_diag.maths.estimators.registry import BASELINES
from otb_diag.maths.noise.budget_stream import DECAY, WINDOW, BudgetPools
from otb_diag.maths.response_batch import ResponseBatch
from otb_diag.runtime.torchrun import Dist

# The variance series of the collapse watch: the proxy `dynamics` reads as `proxy2` of a log.
WATCHED_PROXY = f"{PREFIX}proxy/grpo/proxy2_total_power"
R = TypeVar("R")  # an adapter's rows of a step on one process
# Where `submit` measures by default: the worker process (`worker.py`). "thread" keeps it in
# this process, where a test can patch what it calls.
MEASURE_IN = "process"


@dataclass
class Share(Generic[R]):
    """What one process hands over at a step's gather."""

    rows: R | None  # its rows of the step; None after an error on this process
    error: str | None  # the error that stopped this process's diagnostics
    dump_dir: Path | None  # the dump directory it was given (the main process writes the dump)


def gather_shares(share: Share[R], place: Dist) -> list[Share[R]]:
    """Every process's share, in process order (`Dist.all_gather`, that is
    `torch.distributed.all_gather_object`: pickled, any shapes); `[share]` with one process."""
    return place.all_gather(share)


def measured(
    batch: ResponseBatch,
    step: int,
    scores: Tensor | None,
    audited: tuple[str, dict[str, Any]] | None,
    baselines: Sequence[str] | None,
    aggregation: str,
    split_under: Mapping[str, Mapping[str, Any]],
    dump_dir: Path | None,
) -> dict[str, float]:
    """A step's metrics (`step_metrics.py:step_and_split_metrics`) and its dump (`dump.py`):
    pure but for the dump, and named at module level, so that the worker process
    (`worker.py`) can be handed it."""
    metrics = step_and_split_metrics(batch, audited, baselines, scores, aggregation, split_under)
    if dump_dir is not None:
        dump_step(dump_dir, batch, step, audited)
    return metrics


def registered_here() -> list[str]:
    """The baselines and aggregations registered by the user's own code rather than shipped
    with otb-diag: their functions live in this process only, and the worker process would not
    know their names."""
    own = [n for n, b in BASELINES.items() if not b.fn.__module__.startswith("otb_diag.")]
    return own + [n for n, f in AGGREGATIONS.items() if not f.__module__.startswith("otb_diag.")]


class LiveCore:
    """The state and the steps every live adapter shares (module docstring).

    audited: the registry estimator (name, options) the trainer's advantages are, None when not
    known; baselines: those whose proxies are logged (None: the registry's defaults);
    aggregation: how the trainer's loss averages per-token terms (`maths/aggregation.py`);
    level: `metric_levels.LEVELS`; record_dir: where `otb_metrics.jsonl` goes (None: nowhere);
    dump_dir: where each measured step is dumped as rollouts (None: not dumped; the main
    process's is used); place: this process's rank among the trainer's processes; measure_in:
    where `submit` measures, "process" (`worker.py`, falling back to a thread where no process
    starts) or "thread" (None: `MEASURE_IN`); controller: the prompts of each update from the
    pooled knee (`controller.py`), decided on the main process, which the adapter realises."""

    def __init__(
        self,
        audited: tuple[str, dict[str, Any]] | None,
        baselines: Sequence[str] | None,
        aggregation: str,
        *,
        level: str = "default",
        record_dir: str | Path | None = None,
        dump_dir: Path | None = None,
        window: int = WINDOW,
        decay: float = DECAY,
        place: Dist | None = None,
        measure_in: str | None = None,
        controller: KneeController | None = None,
    ) -> None:
        self.audited = audited
        self.baselines = baselines
        self.aggregation = aggregation
        self.split_under = split_baselines(audited)  # the trainer's own estimator and OTB
        self.level = level
        self.record = FullRecord(record_dir) if record_dir is not None else None
        self.dump_dir = dump_dir
        self.watch = CollapseWatch()
        self.budget = BudgetPools(PREFIX, window, decay)  # `otb/budget/...`
        self.last: dict[str, float] = {}  # the latest step's metrics (for a user's own use)
        self.place = place or Dist()  # one process by default
        self.enabled = True
        self.error: str | None = None  # this process's error, not yet handed over
        self._dirs_checked = False
        self.measure_in = measure_in or MEASURE_IN
        self.controller = controller  # fed every step's metrics in `finish` (main process)
        # the main process's worker (`worker.py`), started here so that the child's imports
        # overlap the trainer's set-up; `submit` starts it where it was not
        self._worker = self._start_worker() if self.place.is_main else None
        self._thread: ThreadPoolExecutor | None = None  # where the worker cannot measure
        self._job: tuple[int, Callable[[], dict[str, float]], dict[str, float]] | None = None

    def trains_with(self, record: tuple[str, dict[str, Any]]) -> None:
        """Make `record` (registry name, options) the estimator the trainer's advantages are,
        set after the core was made (`attach(advantages=...)`): the one audited and dumped,
        the split's own (its options winning over OTB's defaults) and the one whose knee the
        controller reads (it read the trainer's former estimator, whose split is no longer
        pooled, and never decided)."""
        self.audited = record
        self.split_under = {**split_baselines(None), record[0]: record[1]}
        if self.controller is not None:
            self.controller.estimator = record[0]

    # -- errors and processes ----------------------------------------------------------------

    def guard(self, step: int, fn: Callable[..., None], *args: Any) -> None:
        """Run `fn(*args)` (for step `step`); on any error, `fail` (the training goes on)."""
        try:
            fn(*args)
        except Exception as e:  # noqa: BLE001  the training must not die of a diagnostic
            self.fail(step, describe(e))

    def fail(self, step: int, what: str) -> None:
        """Say once that the diagnostics stop at `step`, and why. One process stops here;
        with several, this one hands `what` over at the next gather, where all stop."""
        if self.error is None:
            where = f" (process {self.place.rank})" * (self.place.world_size > 1)
            warnings.warn(
                f"otb-diag live diagnostics switched off at step {step}{where}: {what}",
                RuntimeWarning,
                stacklevel=3,
            )
            self.error = what
        if self.place.world_size == 1:
            self.enabled = False

    def gather(self, step: int, rows: Callable[[], R]) -> list[R] | None:
        """Every process's `rows()` of `step`, in process order, on every process; None where
        the diagnostics stop: this process's error or another's (handed over here: every
        process stops together) or the gather's own failure. A collective: every process calls
        it at the same point of the step, even after its own error."""
        mine = None
        if self.error is None:
            try:
                mine = rows()
            except Exception as e:  # noqa: BLE001  a forward can fail on one process
                self.fail(step, describe(e))
        try:
            shares = gather_shares(Share(mine, self.error, self.dump_dir), self.place)
        except Exception as e:  # noqa: BLE001  no agreement is possible without the group
            self.fail(step, f"the step's rows could not be gathered ({describe(e)})")
            self.enabled = False
            return None
        if any(s.error is not None for s in shares):
            self.enabled = False  # every process, together (the failing one has said why)
            return None
        if self.place.is_main:
            self._check_dump_dirs(shares)
        return [s.rows for s in shares]  # type: ignore[misc]  no error: every share has rows

    def _check_dump_dirs(self, shares: Sequence[Share]) -> None:
        """Warn once where another process was given a dump directory that is not the main
        process's: the main process writes every process's rows, to its own `dump_dir`."""
        if self._dirs_checked:
            return
        self._dirs_checked = True
        other = {
            i: s.dump_dir
            for i, s in enumerate(shares)
            if s.dump_dir is not None and s.dump_dir != self.dump_dir
        }
        if other:
            given = ", ".join(f"process {i}: {d}" for i, d in other.items())
            main = self.dump_dir or "none, so nothing is dumped"
            warnings.warn(
                f"otb-diag: the main process writes the dump of every process's rows, to its "
                f"own dump_dir ({main}); the dump_dir given elsewhere ({given}) is not used.",
                RuntimeWarning,
                stacklevel=4,
            )

    # -- a step's metrics ----------------------------------------------------------------------

    def measure(
        self, batch: ResponseBatch, step: int, scores: Tensor | None = None
    ) -> dict[str, float]:
        """The step's metrics from its rows (scores `[B, C, k]` on split steps), and its dump,
        in this thread."""
        return measured(batch, step, scores, *self._settings())

    def _settings(self) -> tuple[Any, ...]:
        """What `measured` takes beside the step: its estimators, aggregation and dump."""
        return self.audited, self.baselines, self.aggregation, self.split_under, self.dump_dir

    def submit(
        self,
        batch: ResponseBatch,
        step: int,
        scores: Tensor | None = None,
        known: Mapping[str, float] | None = None,
    ) -> None:
        """`measure` in the core's worker process (`worker.py`: beside the trainer, not on its
        interpreter), while the trainer's backward pass and optimizer step run; `known`:
        metrics the adapter already has, joined to the measured ones. `collect` at the step's
        end takes them. With a baseline or an aggregation of the user's own registered (known
        to this process only, `registered_here`), on a thread of this process instead."""
        if self._worker is None:
            self._worker = self._start_worker()
        if isinstance(self._worker, Worker) and not registered_here():
            worker = self._worker
            ticket = worker.submit(measured, batch, step, scores, *self._settings())
            self._job = (step, lambda: worker.result(ticket), dict(known or {}))
            return
        if self._thread is None:
            self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="otb-diag")
        future = self._thread.submit(self.measure, batch, step, scores)
        self._job = (step, future.result, dict(known or {}))

    def _start_worker(self) -> Worker | None:
        """This process's worker process (`worker.shared_worker`); None where `measure_in` says
        "thread" or none can be started (said once)."""
        if self.measure_in != "process":
            return None
        try:
            return shared_worker()
        except (OSError, ValueError) as e:  # ValueError: no pass_fds (Windows)
            self.measure_in = "thread"
            warnings.warn(
                f"otb-diag: no worker process could be started ({e}); the live metrics are "
                "measured on a thread of the trainer's process, which slows its steps.",
                RuntimeWarning,
                stacklevel=4,
            )
            return None

    @property
    def measuring(self) -> int | None:
        """The step submitted and not yet collected; None when there is none."""
        return self._job[0] if self._job is not None else None

    def collect(
        self, pooled_too: Mapping[str, float] | None = None
    ) -> tuple[int, dict[str, float]] | None:
        """The submitted step and its every metric (`finish`, with `pooled_too`), once the
        worker is done; None when none is waiting. Raises the worker's error."""
        if self._job is None:
            return None
        step, result, known = self._job
        self._job = None
        return step, self.finish(step, result() | known, pooled_too)

    def add_grad_norm(self, step: int, value: float) -> None:
        self.watch.add_grad_norm(step, value)

    def finish(
        self, step: int, metrics: Mapping[str, float], pooled_too: Mapping[str, float] | None = None
    ) -> dict[str, float]:
        """Every metric of the step: `metrics`, the collapse watch's, and the split pooled over
        the steps so far (fed `metrics` and `pooled_too`, e.g. the all-parameter estimate of
        `trl/ddp_noise.py`, which joins the pools on the split's steps); kept as `last` and
        appended to the full record."""
        out = dict(metrics)
        if WATCHED_PROXY in out:
            self.watch.add_variance(step, out[WATCHED_PROXY])
        out |= {PREFIX + k: v for k, v in self.watch.metrics().items()}
        out |= self.budget.update(out | dict(pooled_too or {}), step)
        if self.controller is not None:
            out |= self.controller.feed(out)  # its decision for the updates to come
        self.last = out
        if self.record is not None:
            self.record.append(step, out)
        return out

    def logged(self, metrics: Mapping[str, float]) -> dict[str, float]:
        """What the dashboard gets of `metrics` at the run's level."""
        own = self.audited[0] if self.audited is not None else None
        return logged_at(metrics, self.level, own, PREFIX)
