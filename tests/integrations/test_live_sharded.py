"""The live core's metrics but the split under FSDP2 (docs/live.md, "Sharded policies"): the
plain PyTorch loop (`plain_loop.py`) on 2 gloo processes with its policy sharded by
`fully_shard` (`plain_fsdp.py`) logs at every step the metrics the same loop logs unsharded on
one process, with nothing warned: log p and Σπ² come from inside `generate`'s forwards
(`GenerationStats`, which a synced process's extra forwards do not widen), rows are gathered,
not parameters, and FSDP's gradient is the one-process gradient (its norm, fed to the collapse
watch, agrees)."""

from __future__ import annotations

import json
import math
from dataclasses import asdict
from pathlib import Path

import pytest
from launch import torchrun
from plain_loop import AGGREGATION, plain_loop
from transformers import AutoModelForCausalLM, AutoTokenizer

from otb_diag.integrations.core.live_core import LiveCore
from otb_diag.io.scenarios import default_checkpoint

SCRIPT = Path(__file__).with_name("plain_fsdp.py")
TAU = 2.5  # mixed rewards: a gradient at every step, so the later steps test FSDP's update
# Two prompts a step, one a process; answers of 3 and 4 digits, so the process with the shorter
# responses often ends first and runs synced forwards past its tokens.
STEPS = [["C:684=", "R:3721="], ["S:951=", "C:1205="], ["R:581=", "S:3107="]]


def finite(metrics: dict[str, float]) -> dict[str, float]:
    return {k: v for k, v in metrics.items() if math.isfinite(v)}


@pytest.mark.torchrun
@pytest.mark.slow  # launches 2 processes that load torch and the model (~10 s)
def test_fsdp_logs_the_one_process_metrics(tmp_path: Path) -> None:
    sharded = tmp_path / "fsdp"
    sharded.mkdir()
    result = torchrun(2, sharded, TAU, json.dumps(STEPS), script=SCRIPT)
    assert result.returncode == 0, result.stderr[-3000:]
    assert [json.loads((sharded / f"warnings{r}.json").read_text()) for r in (0, 1)] == [[], []]
    logged = json.loads((sharded / "logged.json").read_text())
    core = LiveCore(("mean", {}), None, AGGREGATION, record_dir=tmp_path / "one")
    model = AutoModelForCausalLM.from_pretrained(default_checkpoint())
    tokenizer = AutoTokenizer.from_pretrained(default_checkpoint())
    one = [asdict(s) for s in plain_loop(model, tokenizer, core, STEPS, TAU)]
    assert len(logged) == len(one) == len(STEPS)
    for fsdp, alone in zip(logged, one, strict=True):
        assert fsdp["grad_norm"] == pytest.approx(alone["grad_norm"], rel=1e-5)
        assert finite(fsdp["metrics"]).keys() == finite(alone["metrics"]).keys()
        assert finite(fsdp["metrics"]) == pytest.approx(finite(alone["metrics"]), rel=1e-5)
    assert logged[-1]["metrics"]["otb/audit/agrees"] == 1.0
    assert all(s["metrics"]["otb/groups/mixed_rewards_fraction"] > 0 for s in logged)  # a gradient
