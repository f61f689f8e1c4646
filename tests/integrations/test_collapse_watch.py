"""The live collapse watch flags what `dynamics/collapse.py:analyse_run` flags on the whole log,
with the same z-scores, while keeping `window + 1` values whatever the run's length."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from hypothesis import given
from hypothesis import strategies as st

from otb_diag.dynamics.collapse import DetectionRule, analyse_run
from otb_diag.integrations.core.collapse_watch import CollapseWatch


def run_log(seed: int, points: int, surge_at: int | None, lead: int) -> pd.DataFrame:
    """A log of `points` steps with noisy grad norm and variance proxy; from `surge_at` the norm
    jumps ×20, the proxy `lead` steps earlier."""
    rng = np.random.default_rng(seed)
    grad = np.exp(rng.normal(0, 0.1, points))
    proxy = np.exp(rng.normal(0, 0.1, points))
    if surge_at is not None:
        grad[surge_at:] *= 20
        proxy[max(0, surge_at - lead) :] *= 20
    return pd.DataFrame(
        {
            "step": np.arange(1, points + 1),
            "grad_norm": grad,
            "score": np.zeros(points),
            "variance_proxy": proxy,
            "variance_proxy_kind": "proxy2_total_power",
            "tokens_sampled": np.nan,
        }
    )


@given(
    seed=st.integers(0, 2**16),
    points=st.integers(5, 120),
    surge=st.one_of(st.none(), st.integers(0, 119)),
    lead=st.integers(0, 10),
)
@pytest.mark.slow  # replays a whole training log through the watch (seconds)
def test_watch_matches_the_offline_rule(seed: int, points: int, surge: int | None, lead: int):
    frame = run_log(seed, points, surge, lead)
    rule = DetectionRule()
    offline = analyse_run(frame, rule)
    watch = CollapseWatch(rule)
    z = []
    for row in frame.itertuples():
        watch.add_variance(row.step, row.variance_proxy)
        watch.add_grad_norm(row.step, row.grad_norm)
        z.append(watch.metrics()["collapse/grad_norm_z"])
        assert len(watch.grad.values) <= rule.window + 1  # bounded memory
    np.testing.assert_allclose(z, offline.grad_norm_z, rtol=1e-12, equal_nan=True)
    assert watch.collapse_step == offline.collapse_step
    assert watch.metrics()["collapse/alarm"] == float(offline.collapse_step is not None)


def test_a_surge_raises_the_alarm() -> None:
    frame = run_log(0, 60, surge_at=40, lead=5)
    watch = CollapseWatch()
    for row in frame.itertuples():
        watch.add_variance(row.step, row.variance_proxy)
        watch.add_grad_norm(row.step, row.grad_norm)
    assert watch.collapse_step == 41
    assert watch.variance.alarm_step == 36  # the proxy rose 5 steps before
    assert watch.metrics()["collapse/grad_norm_z"] == pytest.approx(
        analyse_run(frame, DetectionRule()).grad_norm_z[-1]
    )
