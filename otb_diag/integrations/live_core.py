"""The trainer-neutral core of the live diagnostics: one step's rows in, its `otb/` metrics out.

Every live adapter (TRL's `attach`, verl's `BudgetTracker`, a plain PyTorch loop:
tests/integrations/plain_loop.py) translates its trainer's hooks, rows, groups and logger,
and hands each measured step to one `LiveCore`, which holds everything else:

    measure(batch, step, scores)   the step's metrics (`step_metrics.py:step_and_split_metrics`:
                                   energy, proxies, audit, and the split where scores are
                                   given) and its dump; pure but for the dump, so an adapter
                                   may run it on a worker thread
    finish(step, metrics)          the collapse watch (`collapse_watch.py`), the split pooled
                                   over the steps (`maths/variance/budget_stream.py`), the
                                   full record (`metric_levels.py:FullRecord`); every metric
    logged(metrics)                what the dashboard gets at the run's level (`metric_levels`)
    add_grad_norm(step, value)     the trainer's gradient norm, for the collapse watch

Its memory is the same whatever the run's length: the watch's windows, the pools' window of step
tuples and moments, the last step's metrics.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from torch import Tensor

from otb_diag.integrations.collapse_watch import CollapseWatch
from otb_diag.integrations.dump import dump_step
from otb_diag.integrations.metric_levels import FullRecord, logged_at
from otb_diag.integrations.step_metrics import PREFIX, split_baselines, step_and_split_metrics
from otb_diag.maths.response_batch import ResponseBatch
from otb_diag.maths.variance.budget_stream import DECAY, WINDOW, BudgetPools

# The variance series of the collapse watch: the proxy `dynamics` reads as `proxy2` of a log.
WATCHED_PROXY = f"{PREFIX}proxy/grpo/proxy2_total_power"


class LiveCore:
    """The state and the steps every live adapter shares (module docstring).

    audited: the registry estimator (name, options) the trainer's advantages are, None when not
    known; baselines: those whose proxies are logged (None: the registry's defaults);
    aggregation: how the trainer's loss averages per-token terms (`maths/aggregation.py`);
    level: `metric_levels.LEVELS`; record_dir: where `otb_metrics.jsonl` goes (None: nowhere);
    dump_dir: where each measured step is dumped as rollouts (None: not dumped)."""

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

    def measure(
        self, batch: ResponseBatch, step: int, scores: Tensor | None = None
    ) -> dict[str, float]:
        """The step's metrics from its rows (scores `[B, C, k]` on split steps), and its dump."""
        metrics = step_and_split_metrics(
            batch, self.audited, self.baselines, scores, self.aggregation, self.split_under
        )
        if self.dump_dir is not None:
            dump_step(self.dump_dir, batch, step, self.audited)
        return metrics

    def add_grad_norm(self, step: int, value: float) -> None:
        self.watch.add_grad_norm(step, value)

    def finish(
        self, step: int, metrics: Mapping[str, float], pooled_too: Mapping[str, float] | None = None
    ) -> dict[str, float]:
        """Every metric of the step: `metrics`, the collapse watch's, and the split pooled over
        the steps so far (fed `metrics` and `pooled_too`, e.g. the all-parameter estimate of
        `ddp_noise.py`, which joins the pools on the split's steps); kept as `last` and
        appended to the full record."""
        out = dict(metrics)
        if WATCHED_PROXY in out:
            self.watch.add_variance(step, out[WATCHED_PROXY])
        out |= {PREFIX + k: v for k, v in self.watch.metrics().items()}
        out |= self.budget.update(out | dict(pooled_too or {}), step)
        self.last = out
        if self.record is not None:
            self.record.append(step, out)
        return out

    def logged(self, metrics: Mapping[str, float]) -> dict[str, float]:
        """What the dashboard gets of `metrics` at the run's level."""
        own = self.audited[0] if self.audited is not None else None
        return logged_at(metrics, self.level, own, PREFIX)
