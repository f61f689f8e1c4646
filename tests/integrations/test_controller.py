"""The knee controller (`integrations/core/controller.py`): the decision rule by hand-built
records, then on a synthetic truth whose noise scale is known and moves (tests/synthetic_knee.py):
not told the knee, it lands near the knee of the fixed-batch steps-examples curve, and its
prompts per update track the true noise scale."""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest
import synthetic_knee as truth

from otb_diag.errors import InputError
from otb_diag.integrations.core.controller import (
    DECIDED,
    POOL,
    PROMPTS,
    UPDATES,
    Knee,
    KneeController,
    KneeRule,
    check_controller,
)
from otb_diag.integrations.trl.update_gate import UpdateGate
from otb_diag.runtime.torchrun import Dist

RULE = KneeRule(base=4, most=64, warmup=3, hysteresis=0.25)


def knee(estimate: float, low: float, high: float, resolved: bool = True) -> Knee:
    return Knee(estimate, low, high, resolved, total=1.0)


def test_nothing_changes_before_the_warm_up() -> None:
    assert RULE.decide(knee(40, 30, 50), 4, records=2) == 4
    assert RULE.decide(knee(40, 30, 50), 4, records=3) == 8  # then it grows (at most × 2)


def test_it_grows_toward_the_resolved_knee_in_whole_base_batches() -> None:
    assert RULE.decide(knee(13, 10, 20), 8, records=5) == 16  # 13 → the multiple of 4 above
    assert RULE.decide(knee(11, 10, 20), 8, records=5) == 12
    assert RULE.decide(knee(900, 500, 1e4), 48, records=5) == 64  # capped at `most`


def test_an_unresolved_knee_grows_to_its_lower_bound_only() -> None:
    unresolved = knee(500, 10.5, math.inf, resolved=False)
    assert RULE.decide(unresolved, 4, records=5) == 8  # T = 10.5 > 5: toward it, × 2 at most
    assert RULE.decide(unresolved, 8, records=5) == 12  # T = 10.5: the multiple above
    assert RULE.decide(knee(500, 9.0, math.inf, resolved=False), 8, records=5) == 8  # ≤ 1.25 P


def test_hysteresis_keeps_a_record_wavering_around_the_batch() -> None:
    prompts = 16
    for estimate in (19.9, 13.0, 19.0, 13.5, 18.0):  # within (16 / 1.25, 1.25 · 16]
        prompts = RULE.decide(knee(estimate, estimate - 1, estimate + 1), prompts, records=9)
    assert prompts == 16


def test_it_shrinks_only_where_the_whole_interval_lies_below() -> None:
    assert RULE.decide(knee(6, 5, 7), 32, records=5) == 8  # interval under 32 / 1.25
    assert RULE.decide(knee(6, 5, 40), 32, records=5) == 32  # its interval reaches 32
    assert RULE.decide(knee(6, 5, 7, resolved=False), 32, records=5) == 32  # a bound: no shrink
    assert RULE.decide(knee(1, 0.5, 2), 32, records=5) == 4  # never under the base batch


def test_no_noise_measured_is_no_decision() -> None:
    assert RULE.decide(Knee(math.inf, math.inf, math.inf, False, total=0.0), 8, 5) == 8
    assert RULE.decide(knee(math.nan, 0.0, math.inf, resolved=False), 8, 5) == 8  # one step
    assert RULE.decide(None, 8, records=5) == 8


def test_the_controller_reads_its_estimators_record_and_logs_its_batch() -> None:
    head = f"otb/budget/grpo/{POOL}/"
    record = {
        head + "noise_scale": 30.0,
        head + "noise_scale_low": 20.0,
        head + "noise_scale_high": 45.0,
        head + "resolved": 1.0,
        head + "total": 2.0,
        "otb/budget/otb/ema/noise_scale": 1e6,  # another estimator's: not read
    }
    controller = KneeController(RULE, "grpo")
    logged = [controller.feed({}) for _ in range(2)] + [controller.feed(record) for _ in range(3)]
    assert controller.records == 3 and controller.prompts == 8 and controller.batches == 2
    # decided 8, while the update in progress (no adapter opened another) takes the base 4
    assert logged[-1] == {"otb/" + PROMPTS: 4.0, "otb/" + DECIDED: 8.0, "otb/" + UPDATES: 0.0}
    controller.updated()
    controller.applying(8)
    assert controller.feed({}) == {
        "otb/" + PROMPTS: 8.0, "otb/" + DECIDED: 8.0, "otb/" + UPDATES: 1.0
    }  # fmt: skip


def test_the_runs_last_update_closes_on_its_last_batch() -> None:
    """The TRL gate (`trl/update_gate.py`) takes the controller's k at each update's end, cut to
    the batches left: 10 batches under k = 4 are updates of 1, 4, 4 and 1 (the last cut from 4),
    none left in `.grad` unapplied at the end; each batch logs the prompts of the update it
    trains in, as applied (the last update's 1 batch, not the decided 4), beside the decision."""
    controller = KneeController(RULE, "grpo")
    controller.prompts = 4 * RULE.base  # decided k = 4 from the first update's end on
    trainer = SimpleNamespace(state=SimpleNamespace(max_steps=10, global_step=0))
    gate = UpdateGate(trainer, controller, Dist())
    closing, logged = [], []
    for step in range(1, 11):
        trainer.state.global_step = step  # TRL counts the batch before `on_step_end`
        closing.append(gate.closing)
        logged.append(controller.feed({}))  # the step's metrics come before its end
        gate.step_end()
    assert [s for s, c in zip(range(1, 11), closing, strict=True) if c] == [1, 5, 9, 10]
    assert controller.updates == 4 and controller.batches == 4
    applied = [m["otb/" + PROMPTS] / RULE.base for m in logged]
    assert applied == [1, 4, 4, 4, 4, 4, 4, 4, 4, 1]  # k of each step's update, as applied
    assert {m["otb/" + DECIDED] for m in logged} == {4 * RULE.base}


def test_bad_settings_are_refused() -> None:
    with pytest.raises(InputError, match="controller must be None or one of 'knee'"):
        check_controller("adaptive")
    assert check_controller("knee") == "knee" and check_controller(None) is None
    with pytest.raises(InputError, match="≥ the base batch of 8"):
        KneeRule(base=8, most=4)
    with pytest.raises(InputError, match="base batch must be a whole number"):
        KneeRule(base=0, most=4)


# -- the synthetic truth ---------------------------------------------------------------------

FIXED = (4, 8, 16, 32, 64, 128, 256, 512)  # prompts a step of the fixed-batch runs


@pytest.fixture(scope="module")
def curve() -> tuple[float, float]:
    """`(S_min, E_min)` of the fixed-batch runs, 3 seeds a batch."""
    runs = [(p, truth.train(100 + s, p).steps) for p in FIXED for s in range(3)]
    return truth.knee_of_curve(runs)


@pytest.mark.slow  # 27 runs to the target (seconds)
def test_the_problems_knee_is_the_curves(curve: tuple[float, float]) -> None:
    """The synthetic truth holds what the theory says: a batch set to the true B(θ) at each
    step lands at the fixed-batch curve's knee (2 S_min, 2 E_min), within 5 %."""
    s_min, e_min = curve
    for seed in range(3):
        run = truth.train(seed, lambda b: max(1, round(b)))
        assert run.steps / (2 * s_min) == pytest.approx(1, abs=0.05)
        assert run.examples / (2 * e_min) == pytest.approx(1, abs=0.05)


@pytest.mark.slow  # 5 controlled runs of ~600 pooled steps (~10 s)
def test_the_controller_lands_near_the_knee_and_tracks_the_noise_scale(
    curve: tuple[float, float],
) -> None:
    """Not told the knee, the controller starts at the base batch, reads only the pooled
    record of the step's own samples, and lands within 25 % of the knee's steps and examples,
    every seed; after its warm-up the true B(θ) lies inside the record's interval on most
    steps, and its prompts follow B(θ) (the median ratio within 30 % of 1)."""
    s_min, e_min = curve
    rule = KneeRule(base=4, most=1024)
    for seed in range(5):
        controller = KneeController(rule, truth.ESTIMATOR)
        run = truth.train(seed, 0, controller)
        assert 0.75 <= run.steps / (2 * s_min) <= 1.25, seed
        assert 0.75 <= run.examples / (2 * e_min) <= 1.25, seed
        head = f"{truth.PREFIX}budget/{truth.ESTIMATOR}/{POOL}/noise_scale"
        after = slice(rule.warmup, None)
        inside = [
            r[head + "_low"] <= b <= r[head + "_high"]
            for r, b in zip(run.records[after], run.knees[after], strict=True)
        ]
        assert np.mean(inside) >= 0.7, seed
        ratio = np.median(np.array(run.prompts[after]) / np.array(run.knees[after]))
        assert 0.7 <= ratio <= 1.3, seed
