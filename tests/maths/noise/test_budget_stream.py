"""`maths/noise/budget_stream.py`: the logged split of each step, keyed as the trainers log
it, pooled per estimator name; a name with only `total` and `grad_sq` (the all-parameter
estimator) pools without a within share; a step without its shape or split adds nothing."""

from __future__ import annotations

import math

import numpy as np
import pytest

from otb_diag.maths.noise.budget_stream import (
    ONE_STEP_NOISE_SCALE,
    POOLS,
    BudgetPools,
    current_name,
)
from otb_diag.maths.noise.pooling import EmaPool, WindowPool


def step(rng: np.random.Generator) -> dict[str, float]:
    t, g, w = 4 + rng.normal(), 0.5 + rng.normal(0, 0.3), 3 + rng.normal(0, 0.2)
    return {
        "otb/split/prompts": 8.0,
        "otb/split/group_size": 4.0,
        "otb/split/mean_response_tokens": 20 + rng.normal(),
        "otb/split/grpo/within": w,
        "otb/split/grpo/between": t - w,
        "otb/split/grpo/total": t,
        "otb/split/grpo/grad_sq": g,
        f"otb/split/grpo/{ONE_STEP_NOISE_SCALE}": t / g,  # a step's own ratio: not pooled
        "otb/split/params/total": 10 * t,
        "otb/split/params/grad_sq": 10 * g + rng.normal(),
        "otb/energy/sequence_mean": 3.0,
    }


def test_every_name_is_pooled_as_the_pools_of_pooling_pool_it() -> None:
    rng = np.random.default_rng(0)
    steps = [step(rng) for _ in range(12)]
    pools = BudgetPools("otb/", window=5, decay=0.9)
    reference = {name: (WindowPool(5), EmaPool(0.9)) for name in ("grpo", "params")}
    for s, metrics in enumerate(steps, start=1):
        out = pools.update(metrics, s)
        for name, (window, ema) in reference.items():
            split = f"otb/split/{name}/"
            row = (
                metrics[split + "total"],
                metrics[split + "grad_sq"],
                metrics.get(split + "within", math.nan),
                8.0,
                4.0,
                metrics["otb/split/mean_response_tokens"],
            )
            for pool, found in zip(POOLS, (window.add(row), ema.add(row)), strict=True):
                for field, value in found.metrics().items():
                    key = f"otb/budget/{name}/{pool}/{field}"
                    assert out[key] == value or (math.isnan(value) and math.isnan(out[key]))
    assert pools.last_step == 12
    assert math.isnan(out["otb/budget/params/window/within_share"])
    assert 0 < out["otb/budget/grpo/window/within_share"] < 1
    assert out["otb/budget/grpo/window/steps"] == 5 and out["otb/budget/grpo/ema/steps"] == 12


def test_a_step_without_its_shape_or_split_adds_nothing() -> None:
    rng = np.random.default_rng(1)
    pools = BudgetPools("otb/")
    no_shape = {k: v for k, v in step(rng).items() if k != "otb/split/prompts"}
    assert pools.update(no_shape) == {}
    assert pools.update({"otb/energy/sequence_mean": 1.0}) == {}
    undefined = step(rng) | {"otb/split/grpo/grad_sq": math.nan}
    out = pools.update(undefined)
    assert "otb/budget/grpo/window/noise_scale" not in out
    assert out["otb/budget/params/window/steps"] == 1
    assert pools.pools.keys() == {"params"}


@pytest.mark.parametrize("prefix", ["otb/", ""])
def test_the_prefix_is_the_callers(prefix: str) -> None:
    rng = np.random.default_rng(2)
    metrics = {prefix + k.removeprefix("otb/"): v for k, v in step(rng).items()}
    out = BudgetPools(prefix).update(metrics)
    assert f"{prefix}budget/grpo/window/noise_scale" in out


def test_a_former_name_of_a_split_field_reads_as_today_s() -> None:
    """One step's noise scale was logged as `split/<name>/noise_scale`, which read as the pooled
    knee beside it: a log of then reads under today's name, from the key's end (a name may hold
    "/"); the pooled knee, the step's shape and every other key stay as they are."""
    renamed = {
        "otb/split/grpo/noise_scale": f"otb/split/grpo/{ONE_STEP_NOISE_SCALE}",
        "otb/split/org/base:v2/noise_scale": f"otb/split/org/base:v2/{ONE_STEP_NOISE_SCALE}",
    }
    kept = [
        "otb/budget/grpo/window/noise_scale",
        "otb/split/grpo/within_share",
        f"otb/split/grpo/{ONE_STEP_NOISE_SCALE}",
        "otb/split/prompts",
        "otb/split/noise_scale",  # no estimator's name: no split field
        "noise_scale",
    ]
    assert {k: current_name(k, "otb/") for k in renamed} == renamed
    assert [current_name(k, "otb/") for k in kept] == kept
