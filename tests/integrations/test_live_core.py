"""The live core's seam: a third adapter, a plain PyTorch policy-gradient loop
(tests/integrations/plain_loop.py, a few dozen lines, no trainer library) on the embedded
checkpoint, hands each step's rows to `LiveCore` as TRL's and verl's adapters do, and gets the
same features: the metrics `otb-diag energy --model-free` gives on the dumped step, the audit of
its own advantages, the collapse watch, the pooled split, the dashboard's level and the full
record `dynamics` reads."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from otb_diag.cli.main import app
from plain_loop import AGGREGATION, plain_loop
from transformers import AutoModelForCausalLM, AutoTokenizer
from trl_toy import PROMPTS
from typer.testing import CliRunner
from unwritten_figures import unwritten_figures

from otb_diag.integrations.core.controller import KneeController, KneeRule
from otb_diag.integrations.core.live_core import LiveCore
from otb_diag.integrations.core.options import LiveOptions
from otb_diag.io.scenarios import default_checkpoint

STEPS, TAU, K = 3, 1.5, 8


def test_a_plain_pytorch_loop_gets_every_live_feature(tmp_path: Path) -> None:
    core = LiveCore(("mean", {}), None, AGGREGATION, record_dir=tmp_path, dump_dir=tmp_path / "otb")
    model = AutoModelForCausalLM.from_pretrained(default_checkpoint())
    tokenizer = AutoTokenizer.from_pretrained(default_checkpoint())
    steps = [PROMPTS[2 * s : 2 * s + 2] for s in range(STEPS)]  # 2 prompts × N a step
    plain_loop(model, tokenizer, core, steps, TAU, split_k=K)
    lines = (tmp_path / "otb_metrics.jsonl").read_text().splitlines()
    record = [json.loads(line) for line in lines]
    assert [r["step"] for r in record] == [1, 2, 3]
    last = record[-1]
    assert all(last[k] == v for k, v in core.last.items() if k in last)  # non-finite left out
    assert len(last) > 100
    assert last["otb/audit/agrees"] == 1.0  # its advantages are the registry's `mean`
    assert "otb/collapse/alarm" in last and "otb/split/mean/within" in last
    assert last["otb/budget/mean/window/steps"] == 3  # the split pooled over the 3 steps
    assert 0 < len(core.logged(core.last)) <= 20  # the dashboard's level
    with unwritten_figures():  # the dumped step reads back as the logged numbers
        result = CliRunner().invoke(app, ["energy", "--model-free", "--rollouts",
                                          str(tmp_path / "otb" / "step_000003.jsonl"),
                                          "--out", str(tmp_path / "e3"), "--quiet"])  # fmt: skip
    assert result.exit_code == 0, result.output
    summary = json.loads((tmp_path / "e3" / "summary.json").read_text())
    energy = summary["energy"]["sequence_energy_mean"]
    assert energy == pytest.approx(last["otb/energy/sequence_mean"], rel=1e-6)


def test_the_plain_loop_varies_its_batch_from_the_controllers_rule(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same decision rule as TRL's gate, realised by the loop sampling that many prompts:
    a rule that decides 2 base batches once it pooled 2 records makes steps 1-2 sample 2
    prompts and steps 3-4 four, each step logging the prompts it trained on (its update's)
    and, beside them, the decision (taken at step 2's end, applied from step 3)."""

    def scheduled(self: KneeRule, knee: object, current: int, records: int) -> int:
        return 2 * self.base if records >= 2 else current

    monkeypatch.setattr(KneeRule, "decide", scheduled)
    rule = LiveOptions(controller="knee").checked().rule(base=2)
    core = LiveCore(
        ("mean", {}),
        None,
        AGGREGATION,
        controller=KneeController(rule, "mean"),
        record_dir=tmp_path,
    )
    model = AutoModelForCausalLM.from_pretrained(default_checkpoint())
    tokenizer = AutoTokenizer.from_pretrained(default_checkpoint())
    logged = plain_loop(model, tokenizer, core, [PROMPTS[:4]] * 4, TAU, split_k=K)
    assert [s.metrics["otb/split/prompts"] for s in logged] == [2, 2, 4, 4]
    assert [s.metrics["otb/controller/prompts_per_update"] for s in logged] == [2, 2, 4, 4]
    assert [s.metrics["otb/controller/decided_prompts"] for s in logged] == [2, 4, 4, 4]
    assert [s.metrics["otb/controller/updates"] for s in logged] == [1, 2, 3, 4]
