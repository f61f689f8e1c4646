"""The result of `otb-diag dynamics`: collapse.json's content as fields, and the text it prints."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from otb_diag.dynamics.units import MIXED_UNITS
from otb_diag.pipelines.results import schema


@dataclass(frozen=True)
class PooledBudget:
    """One estimator's split pooled over the run's split steps (`pipelines/pooled_budget.py`), as
    the live `attach` logs it under `otb/budget/<estimator>/...`."""

    estimator: str  # a baseline under the trainer's aggregation, or `params`
    step: int  # the last split step pooled
    sentence: str  # `pooling.Pooled.sentence` of the window: the knee or its honest bound
    window: dict[str, float | None]  # `pooling.Pooled.metrics()`, the last `WINDOW` split steps
    ema: dict[str, float | None]  # the same, EMA-weighted (None: not finite)


@dataclass(frozen=True)
class DynamicsRun:
    """One training log's row of collapse.json, the row `plots/dynamics.py` draws from: what it
    is, what `dynamics/collapse.py:analyse_run` found in it, whether its variance signals mix
    units (`dynamics/units.py`), and the live diagnostics' last values when it logged them."""

    run: str  # the run's name (its --label)
    file: str  # the log, absolute
    source: str  # the format the log was read as
    baseline: str | None
    group_size: int | None
    points: int  # logged points
    first_step: int
    last_step: int
    final_score_smoothed: float | None
    collapse_step: int | None
    collapse_z: float | None  # the robust z of log grad-norm at the collapse
    warning_step: int | None
    lead_steps: int | None  # collapse − warning
    variance_proxy_kind: str  # the column read as the variance proxy, or "none"
    tokens_to_target: float | None
    proxy3_mixes_units: bool
    units_note: str | None
    # `otb/` metric -> its last logged value (docs/live.md); None, and absent from collapse.json,
    # when the log has none. The one field that may be absent: files written before it existed.
    otb: dict[str, float] | None = None
    # The logged split pooled over the run, one per estimator; None where the log has no split.
    budget: list[PooledBudget] | None = None


@dataclass(frozen=True)
class DynamicsResult(schema.Versioned):
    """What `otb-diag dynamics` found (`to_json()` is its collapse.json): one row per training
    log in `runs`."""

    command: ClassVar[str] = "dynamics"

    rule: dict[str, Any]  # DetectionRule's parameters and its description
    target: float | None
    runs: list[DynamicsRun]
    outputs: str  # the output directory

    @property
    def live_runs(self) -> list[DynamicsRun]:
        """The runs whose logs carry the live diagnostics."""
        return [r for r in self.runs if r.otb is not None]

    def to_json(self) -> dict[str, Any]:
        record = super().to_json()
        for row in record["runs"]:
            if row["otb"] is None:  # as collapse.json always had it: "otb" only when logged
                del row["otb"]
        return record

    def format(self) -> str:
        """One line per run, then the rule and where the outputs are."""
        target = self.target
        tokens_head = f"tokens to {target:g}" if target is not None else "tokens to target"
        head = (
            f"{'run':<20} {'baseline':<8} {'N':>4} {'steps':>11} {'collapse':>9} {'warning':>8} "
            f"{'lead':>5} {tokens_head:>15}  variance proxy"
        )
        lines = [head]
        for r in self.runs:
            lines.append(
                f"{r.run[:20]:<20} {_cell(r.baseline):<8} {_cell(r.group_size):>4} "
                f"{r.first_step:>5}-{r.last_step:<5} {_cell(r.collapse_step):>9} "
                f"{_cell(r.warning_step):>8} {_cell(r.lead_steps):>5} "
                f"{_cell(r.tokens_to_target, '{:.3g}'):>15}  {r.variance_proxy_kind}"
            )
        lines += [f"{r.run}: {b.sentence}." for r in self.runs for b in r.budget or []]
        mixed = [r.run for r in self.runs if r.proxy3_mixes_units]
        if mixed:
            lines.append(f"note ({', '.join(mixed)}): {MIXED_UNITS}.")
        lines.append(f"rule: {self.rule['description']}")
        # + the live diagnostics', + the pooled noise scale's
        figures = 3 + bool(self.live_runs) + any(r.budget for r in self.runs)
        lines.append(f"wrote dynamics.csv, collapse.json and {figures} figures to {self.outputs}")
        return "\n".join(lines)


def _cell(value: Any, fmt: str = "{}") -> str:
    return "—" if value is None else fmt.format(value)
