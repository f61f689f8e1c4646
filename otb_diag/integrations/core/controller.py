"""Acting on the answer: the prompts per optimizer update, set from the pooled noise scale.

The knee of a run, the critical batch `B = tr Σ / |G|²` in prompts, is where a step's noise
equals its signal (McCandlish et al. 2018, "An Empirical Model of Large-Batch Training"). The
steps S and the examples E a run needs to reach a target trade off as

    (S / S_min − 1)(E / E_min − 1) = 1,        E_min / S_min ≈ B

so below the knee a batch is frugal in tokens but needs many sequential steps, and above it the
tokens are wasted. An RL step is sequential (generate, reward, update), and on a GPU a larger
batch costs little more wall time until the device is full: running near the knee saves steps at
a bounded cost in tokens. The knee moves while the policy trains, so a fixed batch is right at
one moment at best. `KneeRule` reads each pooled record of the knee (`maths/noise/pooling.py`,
logged as `otb/budget/<estimator>/<pool>/...`) and sets the prompts of the next update:

    wait        until `warmup` records are pooled (a pool of a few steps says little)
    target      T = B̂ where the knee is resolved (|G|²'s interval above 0), else its lower
                bound B_low (the knee is at least that: a run under it is below its knee
                whatever the truth); no decision where neither is a number (no noise measured)
    grow        when T > (1 + h) · P: to the multiple of the base batch P₀ at or above T, at
                most doubling in one decision and at most `most`
    shrink      when the knee is resolved and its whole interval lies under P / (1 + h): to the
                multiple of P₀ at or above B̂ (never under P₀)
    otherwise   keep P (h: the hysteresis, so that a record wavering around P does not flap)

The prompts are whole multiples `k · P₀` of the trainer's configured batch: an adapter realises
k by accumulating the gradients of k generation batches into one update (TRL: `trl/update_gate.py`)
or by sampling k · P₀ prompts (a loop that sets its batch directly). Its limits: the pooled knee
lags a moving one by about half its memory (`docs/noise-scale.md`, "Drift"); the knee is that of
the estimator the trainer trains with, measured in the output layer's scores (head mode) unless
the all-parameter estimate is pooled; and it says nothing about the learning rate, which the
theory ties to the batch (a larger batch affords a larger step; this rule keeps the trainer's).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from otb_diag.errors import InputError
from otb_diag.io.training_logs import CONTROLLER_DECIDED as DECIDED
from otb_diag.io.training_logs import CONTROLLER_PROMPTS as PROMPTS
from otb_diag.io.training_logs import CONTROLLER_UPDATES as UPDATES
from otb_diag.io.training_logs import OTB_PREFIX as PREFIX
from otb_diag.maths.noise.budget_stream import BUDGET

CONTROLLERS = ("knee",)  # what `attach(controller=...)` and the plain loop take
POOL = "ema"  # the pool the rule reads: the more recent answer (the window is the more certain)


@dataclass(frozen=True)
class Knee:
    """One pooled record of the knee, in prompts a step: `estimate` and its 95 % interval;
    `resolved` where |G|²'s interval lies above 0; `total` the pooled tr Σ."""

    estimate: float
    low: float
    high: float
    resolved: bool
    total: float

    @classmethod
    def from_metrics(
        cls, metrics: Mapping[str, float], estimator: str, prefix: str = PREFIX
    ) -> Knee | None:
        """The record `budget_stream.BudgetPools` logged for `estimator` in one step's
        `metrics`; None on a step that pooled nothing (no split)."""
        head = f"{prefix}{BUDGET}{estimator}/{POOL}/"
        if head + "noise_scale" not in metrics:
            return None
        value = {k: metrics.get(head + k, math.nan) for k in ("noise_scale", "total")}
        ends = {k: metrics.get(head + f"noise_scale_{k}", math.nan) for k in ("low", "high")}
        return cls(
            value["noise_scale"],
            ends["low"],
            ends["high"],
            metrics.get(head + "resolved", 0.0) == 1.0,
            value["total"],
        )


@dataclass(frozen=True)
class KneeRule:
    """The decision of the module docstring. base: P₀, the trainer's configured prompts a
    generation batch (the floor); most: the most prompts an update may take; warmup: pooled
    records before the first change; hysteresis: h; growth: the largest factor of one
    decision."""

    base: int
    most: int
    warmup: int = 3
    hysteresis: float = 0.25
    growth: float = 2.0

    def __post_init__(self) -> None:
        if not (isinstance(self.base, int) and self.base >= 1):
            raise InputError(
                f"the controller's base batch must be a whole number ≥ 1; got {self.base!r}."
            )
        if not (isinstance(self.most, int) and self.most >= self.base):
            raise InputError(
                f"the controller's most prompts an update ({self.most!r}) must be a whole "
                f"number ≥ the base batch of {self.base} prompts."
            )

    def target(self, knee: Knee) -> float:
        """T: the resolved knee, else its lower bound; NaN where neither says anything (no
        noise measured: tr Σ pooled to ≤ 0, or no interval yet)."""
        if knee.total <= 0:
            return math.nan
        value = knee.estimate if knee.resolved else knee.low
        return value if value > 0 else math.nan  # 0: one step, no bound yet

    def decide(self, knee: Knee | None, current: int, records: int) -> int:
        """The prompts of the next update, from the latest record `knee` (None: no new one),
        `current` prompts an update now and the `records` pooled so far."""
        if knee is None or records < self.warmup:
            return current
        target = self.target(knee)
        if math.isnan(target):
            return current
        if target > (1 + self.hysteresis) * current:
            grown = min(target, self.growth * current, self.most)
            return min(self.multiple(grown), self.most_multiple)
        if knee.resolved and knee.high < current / (1 + self.hysteresis):
            return max(self.multiple(target), self.base)
        return current

    def multiple(self, prompts: float) -> int:
        """The multiple of the base batch at or above `prompts`."""
        return self.base * max(1, math.ceil(prompts / self.base - 1e-9))

    @property
    def most_multiple(self) -> int:
        """The largest multiple of the base batch within `most`."""
        return self.base * (self.most // self.base)


class KneeController:
    """The rule's state over a run, fed each step's every metric by the live core (`feed`):
    the prompts it decided and the records pooled so far. `prompts` is what the next update
    to open should take; `batches` is it in generation batches of P₀ prompts; `applied` is
    what the update the current batch belongs to takes, as the adapter realised it
    (`applying`).

    The two differ: a decision is taken at a step's end, an update opens only after the last
    one closed, and a later decision may replace an earlier one before any update took it (a
    TRL run decided 8 prompts at step 4 and 16 at step 5, inside an update of 4: the next
    update took 16, and no update ever took 8). So each step logs both: `PROMPTS`, the
    prompts of the update its batch trains in (what happened), and `DECIDED`."""

    def __init__(self, rule: KneeRule, estimator: str, prefix: str = PREFIX) -> None:
        self.rule = rule
        self.estimator = estimator  # whose pooled knee it reads: the trainer's own
        self.prefix = prefix
        self.prompts = rule.base
        # The first update takes the base batch; an adapter that realises the decisions says
        # what each later one takes (`applying`), one that does not (verl's tracker) leaves it.
        self.applied = rule.base
        self.records = 0
        self.updates = 0  # optimizer updates done, counted by the adapter (`updated`)

    @property
    def batches(self) -> int:
        return self.prompts // self.rule.base

    def feed(self, metrics: Mapping[str, float]) -> dict[str, float]:
        """Read the step's pooled record, if any, and decide; the step's `PROMPTS` (the
        prompts of the update its batch belongs to: fed at the step's end, before the adapter
        opens the next update), `DECIDED` and `UPDATES` metrics."""
        knee = Knee.from_metrics(metrics, self.estimator, self.prefix)
        if knee is not None:
            self.records += 1
            self.prompts = self.rule.decide(knee, self.prompts, self.records)
        return {
            self.prefix + PROMPTS: float(self.applied),
            self.prefix + DECIDED: float(self.prompts),
            self.prefix + UPDATES: self.updates,
        }

    def applying(self, prompts: int) -> None:
        """The adapter opens an update of `prompts` prompts (the decision it took, cut where
        the run ends first): the batches from now on, until it closes, belong to it."""
        self.applied = prompts

    def updated(self) -> None:
        """One optimizer update done."""
        self.updates += 1


def check_controller(controller: str | None) -> str | None:
    """`controller` when None or one of `CONTROLLERS`; an `InputError` otherwise."""
    if controller is not None and controller not in CONTROLLERS:
        raise InputError(
            f"controller must be None or one of {', '.join(map(repr, CONTROLLERS))}; got "
            f"{controller!r}.",
            hint="controller='knee' sets the prompts of each update from the pooled noise "
            "scale (docs/noise-scale.md, 'Acting on the answer').",
        )
    return controller
