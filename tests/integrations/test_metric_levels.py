"""What a step logs to the dashboard: a default `attach` logs at most 20 `otb/` keys a step,
the answers a person reads (`metric_levels.HEADLINE`), at the values `metrics="all"` logs; every
metric still reaches `otb_metrics.jsonl`, from which `dynamics`' reader rebuilds the very table
a `metrics="all"` log gives. And `attach`'s refusals: an unknown level or baseline, a second
call; its warning after `train()`."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
from trl_toy import toy_trainer

from otb_diag.errors import InputError
from otb_diag.integrations.core.metric_levels import HEADLINE, check_level, logged_at
from otb_diag.integrations.trl import attach
from otb_diag.io.trainers.trl import OTB_RECORD
from otb_diag.io.training_logs import otb_record, read_training_log

pytestmark = pytest.mark.external  # runs TRL
STEPS = 3


def trained(folder: Path, level: str) -> Path:
    """A 3-step toy run with the split at every step at `level`; its trainer_state.json."""
    trainer = toy_trainer(folder, STEPS, temperature=2.0)  # mixed groups: the split resolves
    attach(trainer, split_every=1, split_k=16, metrics=level)
    trainer.train()
    state = folder / "trainer_state.json"
    trainer.state.save_to_json(str(state))
    return state


def otb_keys(state: Path) -> list[dict[str, float]]:
    history = json.loads(state.read_text())["log_history"]
    return [{k: v for k, v in e.items() if k.startswith("otb/")} for e in history if "step" in e]


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("levels")
    return {level: trained(root / level, level) for level in ("default", "all")}


def test_a_default_step_logs_at_most_20_keys_at_the_values_all_logs(runs) -> None:
    default, every = otb_keys(runs["default"]), otb_keys(runs["all"])
    assert len(default) == len(every) == STEPS + 1  # and TRL's closing entry, with none
    for few, many in zip(default[:STEPS], every[:STEPS], strict=True):
        assert 8 <= len(few) <= 20 < len(many)
        assert few == {k: many[k] for k in few}
        assert "otb/budget/grpo/window/resolved" in few  # the pooled answer, every step
        assert "otb/otb_over_mean/without_zero_tail/proxy2_total_power" in few
    logged = {k.removeprefix("otb/") for step in default for k in step}
    named = {k.format(own="grpo") for k in HEADLINE}
    assert logged <= named
    assert len(named) <= 20


def test_the_full_record_gives_dynamics_what_all_logs(runs) -> None:
    """Every metric reaches otb_metrics.jsonl at either level, and the reader merges it into
    the trainer's log: the default run reads back as the same table as the `all` run."""
    records = [(runs[level].parent / OTB_RECORD).read_text() for level in ("default", "all")]
    assert records[0] == records[1] and len(records[0].splitlines()) == STEPS
    frames = [read_training_log(runs[level]).frame for level in ("default", "all")]
    otb = [f[sorted(c for c in f.columns if c.startswith("otb/"))] for f in frames]
    assert otb[1].shape[1] > 100
    pd.testing.assert_frame_equal(otb[0], otb[1])


def test_logged_at_keeps_the_headline_of_the_trainers_estimator() -> None:
    metrics = {
        "otb/budget/rloo/window/noise_scale": 3.0,
        "otb/budget/grpo/window/noise_scale": 4.0,
        "otb/budget/otb/window/noise_scale": 2.0,
        "otb/proxy/rloo/proxy2_total_power": 1.0,
        "otb/collapse/alarm": 0.0,
    }
    assert logged_at(metrics, "default", "rloo") == {
        "otb/budget/rloo/window/noise_scale": 3.0,
        "otb/budget/otb/window/noise_scale": 2.0,
        "otb/collapse/alarm": 0.0,
    }
    assert logged_at(metrics, "default", None) == {
        "otb/budget/otb/window/noise_scale": 2.0,
        "otb/collapse/alarm": 0.0,
    }
    assert logged_at(metrics, "all", "rloo") == metrics
    with pytest.raises(InputError, match="metrics must be one of 'default', 'all'; got 'some'"):
        check_level("some")


def test_a_broken_full_record_is_named(tmp_path: Path) -> None:
    state = tmp_path / "checkpoint-2" / "trainer_state.json"
    state.parent.mkdir()
    (tmp_path / OTB_RECORD).write_text('{"step": 1, "otb/x": 1.0}\n{"step": 2, "otb/x": 2.0}\n')
    assert otb_record(state) == {1: {"step": 1, "otb/x": 1.0}, 2: {"step": 2, "otb/x": 2.0}}
    (tmp_path / OTB_RECORD).write_text('{"step": 1}\n{"step": 2.5}\n')
    with pytest.raises(InputError, match="line 2") as caught:
        otb_record(state)
    assert caught.value.field == "step" and caught.value.path == tmp_path / OTB_RECORD
    (tmp_path / OTB_RECORD).write_text('{"step": 1}\nnot json\n')
    with pytest.raises(InputError, match="not valid JSON"):
        otb_record(state)
    assert otb_record(tmp_path / "a" / "b" / "trainer_state.json") == {}  # no record there
    assert otb_record(tmp_path / "a" / "b" / "trainer_state.json") == {}  # no record there


def test_attach_refuses_an_unknown_baseline_a_level_and_a_second_call(tmp_path: Path) -> None:
    trainer = toy_trainer(tmp_path / "run", 1)
    with pytest.raises(InputError, match="unknown baseline 'dr_grpo'"):
        attach(trainer, baselines=["otb", "dr_grpo"])
    with pytest.raises(InputError, match="metrics must be one of"):
        attach(trainer, metrics="everything")
    attach(trainer)
    with pytest.raises(InputError, match="already called on this trainer"):
        attach(trainer)


@pytest.mark.parametrize("sharding", ["FSDP1", "DeepSpeed ZeRO-3"])
def test_attach_on_a_sharded_trainer_takes_the_split_or_says_what_is_missing(
    sharding: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Set as accelerate sets them for `fsdp=` (version 1) / a ZeRO-3 config (not runnable on
    the CPU: accelerate ignores `fsdp` with `use_cpu`; ZeRO-3 trains in
    tests/integrations/test_trl_sharded.py): an extra forward is refused under either, FSDP1's
    split too; ZeRO-3's default split is taken."""
    from types import SimpleNamespace

    trainer = toy_trainer(tmp_path / "run", 1)
    if sharding == "FSDP1":
        trainer.is_fsdp_enabled = True
    else:
        plugin = property(lambda _: SimpleNamespace(zero_stage=3))
        monkeypatch.setattr(type(trainer.accelerator.state), "deepspeed_plugin", plugin)
    with pytest.raises(InputError, match=f"under {sharding} every forward is a collective"):
        attach(trainer, split_every=None, extra_forward=True)
    if sharding == "FSDP1":
        with pytest.raises(InputError, match="runs FSDP1, whose flat parameters") as caught:
            attach(trainer)  # the default splits every 10th step
        assert "split_every=None" in str(caught.value.hint)
        attach(trainer, split_every=None)  # the rest is taken
    else:
        assert attach(trainer).hidden.sharded  # the split, its layer gathered for the scoring


def test_attach_after_training_says_when_it_starts(tmp_path: Path) -> None:
    trainer = toy_trainer(tmp_path / "run", 1)
    trainer.train()
    with pytest.warns(UserWarning, match="after the trainer trained 1 steps"):
        attach(trainer)
