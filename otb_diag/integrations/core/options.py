"""The live diagnostics' options, declared once and checked in one place: TRL's `attach`, verl's
`BudgetTracker` and a plain loop (tests/integrations/plain_loop.py) take them, read their
defaults here and fail with the same message on the same bad value (as cleanrl's `Args` or
torchtune's checked configs do for theirs).

    every          measure every `every`-th step
    split_every    the within/between split at every `split_every`-th measured step (None or
                   0: never); the pooled knee (`otb/budget/...`) is the split's
    split_k        the split's head-mode sketch dimension (`step_split.SPLIT_K`)
    baselines      the baselines whose proxies are logged (None: the registry's defaults)
    metrics        what reaches the dashboard (`metric_levels.LEVELS`)
    controller     None, or "knee": the prompts of each update from the pooled knee
                   (`controller.py`); it reads the split, so it needs `split_every`
    most_prompts   the controller's most prompts an update (None: `MOST_BATCHES` base batches)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from otb_diag.errors import InputError
from otb_diag.integrations.core.controller import KneeRule, check_controller
from otb_diag.integrations.core.metric_levels import check_level
from otb_diag.maths.estimators.registry import get_baseline
from otb_diag.maths.noise.step_split import SPLIT_K

MOST_BATCHES = 8  # the controller's default ceiling, in the trainer's base batches


@dataclass(frozen=True)
class LiveOptions:
    """The options of the module docstring, with their defaults."""

    every: int = 1
    split_every: int | None = 10
    split_k: int = SPLIT_K
    baselines: Sequence[str] | None = None
    metrics: str = "default"
    controller: str | None = None
    most_prompts: int | None = None

    def checked(self) -> LiveOptions:
        """These options, `split_every` None made 0 and `baselines` a tuple; an `InputError`,
        before anything is changed, for the first bad one."""
        whole(self.every, "every", 1)
        split_every = self.split_every or 0
        whole(split_every, "split_every", 0, "or None")
        whole(self.split_k, "split_k", 1)
        check_level(self.metrics)
        for name in self.baselines or ():
            get_baseline(name)  # an unknown one is refused here, not at the first step
        if check_controller(self.controller) is not None:
            if not split_every:
                raise InputError(
                    f"controller={self.controller!r} reads the knee pooled from the split, "
                    "which split_every=None switches off.",
                    hint="Give split_every a whole number ≥ 1 (10 by default: the record it "
                    "reads is renewed every 10th measured step).",
                )
            if self.most_prompts is not None:
                whole(self.most_prompts, "most_prompts", 1)
        baselines = None if self.baselines is None else tuple(self.baselines)
        return replace(self, split_every=split_every, baselines=baselines)

    def rule(self, base: int) -> KneeRule:
        """The controller's rule for a trainer of `base` prompts a generation batch."""
        most = self.most_prompts if self.most_prompts is not None else MOST_BATCHES * base
        return KneeRule(base=base, most=most)


DEFAULTS = LiveOptions()


def whole(value: object, name: str, least: int, also: str = "") -> None:
    """An `InputError` unless `value` is a whole number ≥ `least`."""
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        after = f" {also}" if also else ""
        raise InputError(f"{name} must be a whole number ≥ {least}{after}; got {value!r}.")
