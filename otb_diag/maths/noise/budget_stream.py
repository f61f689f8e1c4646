"""The logged split of every step, pooled as it streams in (`pooling.py`): the one object that
TRL's `attach`, verl's `BudgetTracker` and `otb-diag dynamics` feed, so the live log and the
log read back give the same pooled numbers.

In (a step's logged metrics, keys under a prefix such as `otb/`):

    split/<name>/total, split/<name>/grad_sq    tr Σ and |G|² of one estimator (a baseline under
    split/<name>/within                          the trainer's aggregation, or `params`), within
                                                 optional: a name without it has no within share
    split/prompts, split/group_size,             the step's P, N and mean response tokens L̄
    split/mean_response_tokens                   (`STEP_SHAPE`), shared by every name

The step's own ratios (`split/<name>/within_share`, `snr` and `ONE_STEP_NOISE_SCALE`,
`step_split.py`) are not pooled: the pools' ratios are ratios of the pooled terms.

Out, for every name pooled so far: `budget/<name>/<pool>/<field>` with `<pool>` `window` (the
last `window` split steps) or `ema` (decay `decay` a split step), `<field>` a `pooling.Pooled`
field or `resolved` (1 or 0).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

from otb_diag.maths.noise.pooling import EmaPool, Pooled, WindowPool

SPLIT = "split/"
BUDGET = "budget/"
STEP_SHAPE = ("prompts", "group_size", "mean_response_tokens")  # P, N, L̄ of the step
POOLS = ("window", "ema")
# One step's noise scale B = total / |G|² is logged as `split/<name>/one_step_noise_scale`, so
# that it does not read as the pooled knee beside it, `budget/<name>/<pool>/noise_scale` (on a
# dashboard both were once `noise_scale`). Logs written before name it as `RENAMED` says;
# `current_name` reads them under today's name.
ONE_STEP_NOISE_SCALE = "one_step_noise_scale"
RENAMED = {"noise_scale": ONE_STEP_NOISE_SCALE}  # a split field's former name -> its name
WINDOW = 100  # split steps in the window
DECAY = 0.95  # the EMA's weight per split step: n_eff → (1 + β)/(1 − β) = 39 steps


class BudgetPools:
    """Every name's window and EMA pools (`pooling.py`); state: `window` tuples and one set of
    moments per name, whatever the run's length."""

    def __init__(self, prefix: str, window: int = WINDOW, decay: float = DECAY) -> None:
        self.prefix = prefix
        self.window, self.decay = window, decay
        self.pools: dict[str, tuple[WindowPool, EmaPool]] = {}
        self.latest: dict[str, dict[str, Pooled]] = {}  # name -> pool -> its last estimates
        self.last_step: int | None = None

    def update(self, metrics: Mapping[str, float], step: int | None = None) -> dict[str, float]:
        """Pool the split in `metrics` (one step's) and return `<prefix>budget/...` for every
        name it holds with finite `total` and `grad_sq` and a finite step shape; {} when none."""
        split = self.prefix + SPLIT
        shape = [metrics.get(split + k, math.nan) for k in STEP_SHAPE]
        if not all(math.isfinite(v) for v in shape):
            return {}
        out: dict[str, float] = {}
        for name in split_names(metrics, split):
            total, grad_sq = (
                metrics.get(f"{split}{name}/{k}", math.nan) for k in ("total", "grad_sq")
            )
            if not (math.isfinite(total) and math.isfinite(grad_sq)):
                continue
            row = (total, grad_sq, metrics.get(f"{split}{name}/within", math.nan), *shape)
            pools = self.pools.setdefault(name, (WindowPool(self.window), EmaPool(self.decay)))
            self.latest[name] = dict(zip(POOLS, (p.add(row) for p in pools), strict=True))
            for pool, found in self.latest[name].items():
                head = f"{self.prefix}{BUDGET}{name}/{pool}/"
                out |= {head + k: v for k, v in found.metrics().items()}
        if out:
            self.last_step = step
        return out


def current_name(key: str, prefix: str) -> str:
    """`key` of a logged metric under today's name: `<prefix>split/<name>/<field>` with `field`
    a former name of `RENAMED` renamed, any other key as it is. Read from the key's end, as
    `split_names` reads it (a name may hold "/")."""
    split = prefix + SPLIT
    head, _, field = key.rpartition("/")
    if key.startswith(split) and len(head) > len(split) and field in RENAMED:
        return f"{head}/{RENAMED[field]}"
    return key


def split_names(keys: Iterable[str], split: str, fields: tuple[str, ...] = ("total",)) -> list[str]:
    """The estimator names of the `split/<name>/<field>` keys, `field` one of `fields`, in the
    keys' order, each once; read from the key's end, so a name may hold any character."""
    ends = tuple("/" + f for f in fields)
    rests = (k[len(split) :] for k in keys if k.startswith(split))
    return list(dict.fromkeys(r.rsplit("/", 1)[0] for r in rests if r.endswith(ends)))
