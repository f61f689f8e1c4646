"""The live core's metrics and the split under FSDP2 (docs/live.md, "Sharded policies"): the
plain PyTorch loop (`plain_loop.py`) on 2 gloo processes with its policy sharded by
`fully_shard` (`plain_fsdp.py`) logs at every step the metrics the same loop logs unsharded on
one process, with nothing warned: log p and Σπ² come from inside `generate`'s forwards
(`GenerationStats`, which a synced process's extra forwards do not widen), rows are gathered,
not parameters, and FSDP's gradient is the one-process gradient (its norm, fed to the collapse
watch, agrees). The split's scores: each process's from its own loss forward with the sharded
output layer gathered for the scoring (`split_capture.py`), against the one process's from an
extra eval forward of its own (`token_scores`): the split and the knee pooled from it agree."""

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
K = 16  # the split's sketch dimension
# The split and its pools: equal at step 1 (the same weights; the scores of each process's loss
# forward against an extra eval forward's); after FSDP's updates the weights differ from the
# one process's at round-off (the gradient norm within 2e-7), which the split's differences of
# sums (within, between) lift to 3e-5 relative at step 3 (seen here). Every other metric: 1e-5.
SPLIT_KEYS = ("otb/split/", "otb/budget/")
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
    result = torchrun(2, sharded, TAU, json.dumps(STEPS), K, script=SCRIPT)
    assert result.returncode == 0, result.stderr[-3000:]
    assert [json.loads((sharded / f"warnings{r}.json").read_text()) for r in (0, 1)] == [[], []]
    logged = json.loads((sharded / "logged.json").read_text())
    core = LiveCore(("mean", {}), None, AGGREGATION, record_dir=tmp_path / "one")
    model = AutoModelForCausalLM.from_pretrained(default_checkpoint())
    tokenizer = AutoTokenizer.from_pretrained(default_checkpoint())
    one = [asdict(s) for s in plain_loop(model, tokenizer, core, STEPS, TAU, split_k=K)]
    assert len(logged) == len(one) == len(STEPS)
    for fsdp, alone in zip(logged, one, strict=True):
        assert fsdp["grad_norm"] == pytest.approx(alone["grad_norm"], rel=1e-5)
        assert finite(fsdp["metrics"]).keys() == finite(alone["metrics"]).keys()
        measured, reference = finite(fsdp["metrics"]), finite(alone["metrics"])
        for key, value in reference.items():  # the split's: other forwards' scores (see above)
            rel = 1e-4 if key.startswith(SPLIT_KEYS) else 1e-5
            assert measured[key] == pytest.approx(value, rel=rel, abs=1e-12), key
    assert logged[-1]["metrics"]["otb/audit/agrees"] == 1.0
    assert all("otb/split/mean/within" in s["metrics"] for s in logged)  # the split, every step
    assert logged[-1]["metrics"]["otb/budget/mean/window/steps"] == len(STEPS)  # pooled
    assert all(s["metrics"]["otb/groups/mixed_rewards_fraction"] > 0 for s in logged)  # a gradient
