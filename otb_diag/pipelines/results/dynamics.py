"""The result of `otb-diag dynamics`: collapse.json's content as fields, and the text it prints."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from otb_diag.dynamics.detection_rule import DetectionRule
from otb_diag.dynamics.units import MIXED_UNITS
from otb_diag.pipelines.results import schema
from otb_diag.pipelines.results.schema import absent
from otb_diag.plots.registry import figures_of

# Said once of the runs whose logs hold no `otb/` key (docs/live.md).
NO_LIVE_KEYS = (
    "no otb/ keys: the otb-diag live diagnostics were not attached or were switched off, so "
    "there is no noise split to pool"
)


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
    # `otb/` metric -> its value at one step (docs/live.md): for each family of metrics (the keys
    # sharing all but their last "/" part), the last step that logged any of them, so that a
    # noise scale and its interval are one step's (None: that step did not log it); None, and
    # absent from collapse.json, when the log has none.
    otb: dict[str, float | None] | None = absent()
    # `otb/` metric -> the step its `otb` value is from; None (absent) with `otb`.
    otb_steps: dict[str, int] | None = absent()
    # The logged split pooled over the run, one per estimator; None where the log has no split.
    budget: list[PooledBudget] | None = None
    # Optimizer updates taken before the batch that reached the target (`tokens_to_target`'s
    # row; `io/training_logs.py:_updates`); None as it is, or in a file written before.
    updates_to_target: int | None = None


@dataclass(frozen=True)
class DynamicsArm:
    """One arm of the comparison at equal tokens (`dynamics/comparison.py:compare_arms`): the
    runs sharing a --label (a baseline at a group size, one run per seed), comparison.csv's
    row."""

    arm: str  # the shared --label (the run's name when it has none)
    baseline: str | None
    group_size: int | None
    runs: list[str]
    collapse_steps: list[int | None]  # the collapse detector's verdict per run (None: none)
    collapsed: int  # runs with a collapse
    tokens_to_target: list[float | None]  # per run (None: never reached)
    reached: int  # runs that reached the target
    tokens_to_target_mean: float | None  # over the runs that reached it
    tokens_to_target_low: float | None  # Student's t 95 % interval of that mean (≥ 2 runs)
    tokens_to_target_high: float | None
    final_score_mean: float | None  # the last trailing-mean score, over the runs
    final_score_low: float | None
    final_score_high: float | None
    # The optimizer updates to the target, as the tokens (None in a file written before them).
    updates_to_target: list[int | None] = field(default_factory=list)
    updates_to_target_mean: float | None = None
    updates_to_target_low: float | None = None
    updates_to_target_high: float | None = None


@dataclass(frozen=True)
class DynamicsResult(schema.Versioned):
    """What `otb-diag dynamics` found (`to_json()` is its collapse.json): one row per training
    log in `runs`."""

    command: ClassVar[str] = "dynamics"

    rule: DetectionRule  # collapse.json adds its description (`rule_json`)
    target: float | None
    runs: list[DynamicsRun]
    outputs: str  # the output directory
    # The comparison at equal tokens, one row per arm, when there are several runs (else []).
    arms: list[DynamicsArm] = field(default_factory=list)

    @property
    def live_runs(self) -> list[DynamicsRun]:
        """The runs whose logs carry the live diagnostics."""
        return [r for r in self.runs if r.otb is not None]

    def rule_json(self) -> dict[str, Any]:
        """The rule as collapse.json holds it: its parameters, then its description."""
        return {**schema.plain(self.rule), "description": self.rule.describe()}

    def to_json(self) -> dict[str, Any]:
        return {**super().to_json(), "rule": self.rule_json()}  # the key keeps its place

    def format(self) -> str:
        """One line per run (tokens and updates to the target only with a --target), then the
        rule and where the outputs are; the runs whose logs hold no live diagnostics are named
        once."""
        target = self.target
        tokens_head = (
            f" {f'tokens to {target:g}':>15} {f'updates to {target:g}':>15}"
            if target is not None
            else ""
        )
        head = (
            f"{'run':<20} {'baseline':<8} {'N':>4} {'steps':>11} {'collapse':>9} {'warning':>8} "
            f"{'lead':>5}{tokens_head}  variance proxy"
        )
        lines = [head]
        for r in self.runs:
            tokens = (
                f" {_cell(r.tokens_to_target, '{:.3g}'):>15} {_cell(r.updates_to_target):>15}"
                if target is not None
                else ""
            )
            lines.append(
                f"{r.run[:20]:<20} {_cell(r.baseline):<8} {_cell(r.group_size):>4} "
                f"{r.first_step:>5}-{r.last_step:<5} {_cell(r.collapse_step):>9} "
                f"{_cell(r.warning_step):>8} {_cell(r.lead_steps):>5}{tokens}  "
                f"{r.variance_proxy_kind}"
            )
        lines += [f"{r.run}: {b.sentence}." for r in self.runs for b in r.budget or []]
        without = [r.run for r in self.runs if r.otb is None]
        if without:
            lines.append(f"{_named(without)}: {NO_LIVE_KEYS}.")
        mixed = [r.run for r in self.runs if r.proxy3_mixes_units]
        if mixed:
            lines.append(f"note ({', '.join(mixed)}): {MIXED_UNITS}.")
        lines += self._comparison_lines()
        lines.append(f"rule: {self.rule.describe()}")
        lines.append(
            f"wrote {', '.join(self.tables())}, collapse.json and {len(self.figures())} figures "
            f"to {self.outputs}"
        )
        return "\n".join(lines)

    def tables(self) -> list[str]:
        """The CSV files the run wrote: dynamics.csv always, budget.csv where a log's split
        pooled, comparison.csv with several runs."""
        made = {"budget.csv": any(r.budget for r in self.runs), "comparison.csv": bool(self.arms)}
        return ["dynamics.csv", *(name for name, wrote in made.items() if wrote)]

    def figures(self) -> list[str]:
        """The figures the run drew (`plots/registry.py`): those every run has, and those whose
        data it made (the live diagnostics, the pooled split, the comparison of arms)."""
        made = {
            "live_runs": bool(self.live_runs),
            "budget": any(r.budget for r in self.runs),
            "arms": bool(self.arms),
        }
        return [e.stem for e in figures_of("dynamics") if e.always or made[e.trigger]]

    def _comparison_lines(self) -> list[str]:
        """The comparison at equal tokens, one line per arm (none without arms)."""
        if not self.arms:
            return []
        target = self.target
        lines = [
            "comparison at equal tokens ("
            + (
                f"tokens and optimizer updates to {target:g}: mean over the runs that reached it, "
                "95 % t interval over them):"
                if target is not None
                else "no --target, so no tokens to a target; the final score's 95 % t interval "
                "over the runs):"
            ),
            f"  {'arm':<20} {'runs':>4}"
            + (
                f" {'reached':>7} {'tokens to target':>28} {'updates to target':>22}"
                if target is not None
                else ""
            )
            + f" {'final score':>22}  collapses",
        ]
        for a in self.arms:
            tokens = _interval(a.tokens_to_target_mean, a.tokens_to_target_low,
                               a.tokens_to_target_high, "{:.3g}")  # fmt: skip
            updates = _interval(a.updates_to_target_mean, a.updates_to_target_low,
                                a.updates_to_target_high, "{:.3g}")  # fmt: skip
            score = _interval(a.final_score_mean, a.final_score_low, a.final_score_high, "{:.3f}")
            collapses = ", ".join(_cell(s) for s in a.collapse_steps)
            reached = (
                f" {a.reached:>4}/{len(a.runs):<2} {tokens:>28} {updates:>22}"
                if target is not None
                else ""
            )
            lines.append(f"  {a.arm[:20]:<20} {len(a.runs):>4}{reached} {score:>22}  {collapses}")
        return lines


def _interval(mean: float | None, low: float | None, high: float | None, fmt: str) -> str:
    """`mean [low, high]`, `mean` alone without an interval, "—" without a mean."""
    if mean is None:
        return "—"
    if low is None or high is None:
        return fmt.format(mean)
    return f"{fmt.format(mean)} [{fmt.format(low)}, {fmt.format(high)}]"


def _named(runs: list[str], shown: int = 4) -> str:
    """`run a`, `runs a, b and c`, or the first `shown` and how many more."""
    if len(runs) == 1:
        return f"run {runs[0]}"
    if len(runs) <= shown:
        return f"runs {', '.join(runs[:-1])} and {runs[-1]}"
    return f"runs {', '.join(runs[:shown])} and {len(runs) - shown} more"


def _cell(value: Any, fmt: str = "{}") -> str:
    return "—" if value is None else fmt.format(value)
