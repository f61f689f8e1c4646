"""Choosing the learning rate from a sweep (`maths/lr_sweep.py`): hand cases."""

from __future__ import annotations

import numpy as np
import pytest

from otb_diag.dynamics.lr_sweep import choose_lr, stability


def test_reward_collapse_is_late_below_half_of_early() -> None:
    scores = np.r_[np.full(20, 0.4), np.full(20, 0.3), np.full(20, 0.19)]
    verdict = stability(1e-3, scores, surge_step=None)
    assert verdict.early_score == pytest.approx(0.4)
    assert verdict.late_score == pytest.approx(0.19)
    assert verdict.reward_collapse and verdict.unstable
    steady = stability(1e-3, np.r_[np.full(20, 0.4), np.full(20, 0.21)], surge_step=None)
    assert not steady.reward_collapse and not steady.unstable  # 0.21 >= 0.5 * 0.4


def test_short_runs_use_halves() -> None:
    verdict = stability(1e-4, np.array([1.0, 1.0, 0.0, 0.0]), surge_step=None)
    assert (verdict.early_score, verdict.late_score) == (1.0, 0.0)
    with pytest.raises(ValueError):
        stability(1e-4, np.array([1.0]), surge_step=None)


def test_surge_alone_is_unstable() -> None:
    assert stability(3e-4, np.full(40, 0.5), surge_step=17).unstable


def test_choose_lowest_unstable_rate_whatever_the_order() -> None:
    flat = np.full(40, 0.5)
    falling = np.r_[np.full(20, 0.5), np.zeros(20)]
    runs = [
        stability(3e-3, falling, None),
        stability(1e-4, flat, None),
        stability(1e-3, flat, 120),
        stability(3e-4, flat, None),
    ]
    lr, reason = choose_lr(runs)
    assert lr == 1e-3
    assert "surge at step 120" in reason
    lr, reason = choose_lr([stability(1e-4, flat, None), stability(3e-3, falling, None)])
    assert lr == 3e-3 and "fell from 0.500 to 0.000" in reason


def test_no_unstable_rate_takes_the_highest_and_says_so() -> None:
    flat = np.full(40, 0.5)
    lr, reason = choose_lr([stability(1e-3, flat, None), stability(1e-4, flat, None)])
    assert lr == 1e-3
    assert reason.startswith("no rate was unstable")
