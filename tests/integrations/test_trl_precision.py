"""`attach` under the precisions users train in, each with a real `GRPOTrainer` on the CPU:
fp32, bf16 and fp16 autocast (`bf16=True`, `fp16=True`: accelerate runs the model's forward under
autocast), and bf16 weights. A default `attach` once logged nothing under `bf16=True`: its
check of the output layer compared the autocast logits with an fp32 rebuild at the fp32
tolerance, failed, and switched every metric off (`policy/forward_pass.py:check_output_layer`).

Each run logs its metrics at every step, the split among them, and the split of step 1 (sampled
by the embedded checkpoint) agrees with the split of the dumped step scored offline in fp32 by
that checkpoint: to float32 round-off in fp32, to the half-precision rounding of the caught
hidden states and logits otherwise. A split whose check fails switches off the split alone."""

from __future__ import annotations

import json
import math
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from trl_toy import toy_trainer

from otb_diag.integrations.core.step_metrics import SPLIT_MODE, split_metrics
from otb_diag.integrations.trl import attach
from otb_diag.integrations.trl.support import LOSS_AGGREGATION
from otb_diag.io.loading import load_rollouts
from otb_diag.io.rollouts.to_batch import make_batch
from otb_diag.io.scenarios import default_checkpoint
from otb_diag.maths.estimators.registry import trainer_baseline
from otb_diag.maths.noise.step_split import SPLIT_SEED
from otb_diag.policy.scores import token_scores as token_scores_module
from otb_diag.policy.scores.token_scores import token_scores

pytestmark = pytest.mark.external  # runs TRL
STEPS, SPLIT_K = 2, 16


def fp16_autocast(model: torch.nn.Module) -> None:
    """The model's forward under fp16 autocast, as accelerate wraps it for `fp16=True` on a GPU
    (on the CPU it runs no fp16 autocast: `native_amp` is off there)."""
    model.forward = torch.autocast("cpu", dtype=torch.float16)(model.forward)


# name -> (GRPOConfig fields, what is done to the model before `attach`, the split's relative
# tolerance against the fp32 offline split). Half precision rounds the caught hidden states and
# the logits they are compared with to 8 (bf16) or 11 (fp16) bits; the split is a quadratic form
# of scores built from them. Measured on this run (27 Nov, torch 2.13 CPU), as a share of the
# largest total: bf16 autocast 3.2e-3, fp16 autocast 5.1e-4, bf16 weights 1.3e-2; fp32 0.
PRECISIONS: dict[str, tuple[dict[str, Any], Callable[[torch.nn.Module], Any] | None, float]] = {
    "fp32": ({}, None, 1e-6),
    "bf16 autocast": ({"bf16": True}, None, 0.02),
    "fp16 autocast": ({}, fp16_autocast, 0.005),
    "bf16 weights": ({}, lambda model: model.to(torch.bfloat16), 0.05),
}
TEMPERATURE = 2.0  # mixed rewards in step 1's groups (the toy model is near-certain at τ = 1)


def run(folder: Path, config: dict[str, Any], prepare: Callable | None) -> list[str]:
    """Train `STEPS` steps with `attach(split_every=1)`; the otb-diag warnings raised."""
    trainer = toy_trainer(folder, STEPS, temperature=TEMPERATURE, **config)
    attach(trainer, dump_dir=folder / "otb", split_every=1, split_k=SPLIT_K, metrics="all")
    if prepare is not None:  # after attach, as accelerate wraps the forward at train()
        prepare(trainer.model)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.train()
    trainer.state.save_to_json(str(folder / "trainer_state.json"))
    return [str(w.message) for w in caught if "otb-diag" in str(w.message)]


def logged(folder: Path) -> list[dict[str, float]]:
    state = json.loads((folder / "trainer_state.json").read_text())
    return [e for e in state["log_history"] if "grad_norm" in e]


@pytest.mark.parametrize("precision", PRECISIONS)
def test_a_default_attach_logs_under_every_precision(precision: str, tmp_path: Path) -> None:
    config, prepare, rel = PRECISIONS[precision]
    assert run(tmp_path, config, prepare) == []  # nothing switched off
    entries = logged(tmp_path)
    assert [e["step"] for e in entries] == list(range(1, STEPS + 1))
    for entry in entries:
        assert entry["otb/energy/sequence_mean"] > 0
        assert entry["otb/audit/agrees"] == 1.0
        assert "otb/split/otb/within" in entry
    batch = make_batch(load_rollouts(tmp_path / "otb" / "step_000001.jsonl"))
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(default_checkpoint())  # fp32
    scores = token_scores(model, batch, SPLIT_MODE, SPLIT_K, SPLIT_SEED).proj
    baselines = {**dict([trainer_baseline("trl")]), "otb": {}}
    offline = split_metrics(batch, scores, baselines, LOSS_AGGREGATION["dapo"])
    scale = max(abs(v) for k, v in offline.items() if k.endswith("/total"))
    for name, value in offline.items():
        if math.isfinite(value) and name.rsplit("/", 1)[-1] in ("within", "between", "total"):
            # the split's terms, at the scale of the largest total (a term that is 0 up to
            # rounding is compared at that scale)
            assert abs(entries[0][name] - value) <= rel * scale, (name, entries[0][name], value)


def test_a_failing_split_switches_off_the_split_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def fails(model: torch.nn.Module) -> None:
        raise AssertionError("the check of the output layer failed")

    monkeypatch.setattr(token_scores_module, "check_output_layer", fails)
    said = run(tmp_path, {}, None)
    assert len(said) == 1
    assert "split switched off at step 1: AssertionError: the check" in said[0]
    assert "split_every=None" in said[0]
    for entry in logged(tmp_path):
        assert entry["otb/energy/sequence_mean"] > 0  # everything else still logged
        assert not any(k.startswith("otb/split/") for k in entry)
