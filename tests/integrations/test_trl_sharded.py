"""`attach` on a sharded TRL policy (docs/live.md, "Sharded policies"): what it refuses, and a
real GRPOTrainer under DeepSpeed ZeRO-3 on 2 gloo processes set beside the same run under DDP.

The two runs (tests/integrations/controller_torchrun.py, launched once a session each; the DDP
one is test_update_gate.py's too) train the toy on the same seeds with the split at every step
and the knee controller, whose rule decides 2 generation batches an update from the 2nd pooled
record: k = 1 for steps 1 and 2, then updates of steps 3-4 and 5-6. Under ZeRO-3 every
parameter is partitioned (no process holds an element of its own outside the forward), the
split's scores are formed with the output layer gathered for the scoring
(`split_capture.py:whole_output_layer`) and the gate holds DeepSpeed's accumulation boundary
(`update_gate.py`). ZeRO-3 logs every `otb/` number DDP logs but the all-parameter estimate,
which it says once why it cannot read; the split, the pooled knee, the controller's decisions,
TRL's gradient norm of each applied update and the parameters after every step equal DDP's to
float round-off."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
from controller_torchrun import STEPS, gated

from otb_diag.errors import InputError
from otb_diag.integrations.trl.ddp_noise import WITHOUT_DDP
from otb_diag.integrations.trl.support import (
    FSDP1,
    FSDP2,
    SUPPORTED,
    ZERO3,
    check_trainer,
    sharding,
)
from otb_diag.integrations.trl.update_gate import check_gate

PARAMS = ("otb/split/params/", "otb/budget/params/")  # DDP's all-parameter estimate only


def trainer_like(fsdp: int | None = None, zero: int | None = None, **args: object) -> object:
    """What `check_trainer`, `sharding` and `check_gate` read of a trainer under FSDP of
    version `fsdp` or DeepSpeed ZeRO stage `zero` (accelerate's plugins, set before `train()`)."""
    fsdp_plugin = SimpleNamespace(fsdp_version=fsdp) if fsdp else None
    deepspeed_plugin = SimpleNamespace(zero_stage=zero) if zero is not None else None
    state = SimpleNamespace(fsdp_plugin=fsdp_plugin, deepspeed_plugin=deepspeed_plugin)
    settings = {"num_iterations": 1, "steps_per_generation": 1, "gradient_accumulation_steps": 1}
    settings |= {"fp16": False, "generation_batch_size": 8} | args
    return SimpleNamespace(
        state=SimpleNamespace(global_step=0),
        accelerator=SimpleNamespace(state=state),
        is_fsdp_enabled=fsdp is not None,
        is_deepspeed_enabled=zero is not None,
        loss_type="dapo",
        num_generations=4,
        args=SimpleNamespace(**settings),
    )


def test_attach_names_the_sharding_and_refuses_what_it_cannot_run_sharded() -> None:
    grpo = SUPPORTED["GRPOTrainer"]
    named = [trainer_like(fsdp=1), trainer_like(fsdp=2), trainer_like(zero=3), trainer_like()]
    assert [sharding(t) for t in named] == [FSDP1, FSDP2, ZERO3, None]
    assert sharding(trainer_like(zero=2)) is None  # ZeRO-1/2 keep the parameters whole
    with pytest.raises(InputError, match="this trainer runs FSDP1, whose flat parameters"):
        check_trainer(trainer_like(fsdp=1), grpo, split_every=10, extra_forward=False)
    check_trainer(trainer_like(fsdp=1), grpo, split_every=0, extra_forward=False)  # no split
    for sharded in (trainer_like(fsdp=2), trainer_like(zero=3)):
        check_trainer(sharded, grpo, split_every=10, extra_forward=False)
        with pytest.raises(InputError, match="would hang the training"):
            check_trainer(sharded, grpo, split_every=0, extra_forward=True)
    check_trainer(trainer_like(), grpo, split_every=10, extra_forward=True)  # unsharded: taken


def test_the_gate_drives_zero3_and_refuses_the_other_deepspeed_stages() -> None:
    assert check_gate(trainer_like(zero=3)) == 2  # 8 completions in groups of 4
    for stage in (0, 1, 2):
        with pytest.raises(InputError, match=f"this trainer runs ZeRO stage {stage}"):
            check_gate(trainer_like(zero=stage))


@pytest.fixture(scope="module")
def zero3(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("deepspeed", reason="the [sharded] extra: make setup-sharded")
    out, result = gated(tmp_path_factory, "zero3")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "switched off" not in result.stderr, result.stderr[-3000:]
    return out


@pytest.fixture(scope="module")
def ddp(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out, result = gated(tmp_path_factory)
    assert result.returncode == 0, result.stderr[-3000:]
    return out


def ranks(out: Path, suffix: str = "") -> list:
    return [json.loads((out / f"rank{r}{suffix}.json").read_text()) for r in (0, 1)]


def trained(out: Path) -> list[dict[str, float]]:
    """TRL's logged entries of the training steps (not its closing summary)."""
    return [e for e in json.loads((out / "log_history.json").read_text()) if "loss" in e]


@pytest.mark.torchrun
@pytest.mark.external  # DeepSpeed's engine under TRL
def test_zero3_partitions_every_parameter_and_says_once_what_it_cannot_measure(
    zero3: Path,
) -> None:
    runs = ranks(zero3, "-run")
    assert [run["held"] for run in runs] == [0, 0]  # every element partitioned away
    for run in runs:  # one word from otb-diag a process: the all-parameter estimate's absence
        said = [w for w in run["warnings"] if "otb-diag" in w]
        assert len(said) == 1 and WITHOUT_DDP["DEEPSPEED"] in said[0], said


@pytest.mark.torchrun
@pytest.mark.external
def test_zero3_logs_ddps_split_knee_and_controller_decisions(zero3: Path, ddp: Path) -> None:
    """Every `otb/` key DDP logs but its all-parameter estimate's, at every step, equal to
    DDP's: to 1e-5 at step 1 (the same weights; the scores under ZeRO-3 from the gathered
    layer), and to 2e-3 relative (1e-6 absolute) on the later steps, whose weights differ at
    round-off (ZeRO-3 reduce-scatters and DDP all-reduces the gradients in other orders, and
    AdamW's normalisation lifts the round-off of near-zero gradient entries). On a step whose
    groups all have equal rewards the step's noise is 0 to round-off (its split ~1e-13), and
    whether the pooled window's intervals are defined there is round-off's: those bounds alone
    may be logged (finite) in one run and left out (not finite) in the other."""
    sharded, plain = trained(zero3), trained(ddp)
    assert [e["step"] for e in sharded] == [e["step"] for e in plain] == list(range(1, STEPS + 1))
    decision, updates = "otb/controller/prompts_per_update", "otb/controller/updates"
    for z, d in zip(sharded, plain, strict=True):
        logged = {k for k in d if k.startswith("otb/") and not k.startswith(PARAMS)}
        ours = {k for k in z if k.startswith("otb/")}
        if d["otb/groups/mixed_rewards_fraction"] > 0:
            assert ours == logged, z["step"]
        else:  # no gradient in the batch: only interval bounds may differ in definedness
            assert all(k.endswith(("_low", "_high")) for k in ours ^ logged), ours ^ logged
        assert any(k.startswith("otb/split/grpo/") for k in ours)  # the split, every step
        assert any(k.startswith("otb/budget/grpo/ema/") for k in ours)  # the knee it pools
        rel, floor = (1e-5, 1e-9) if z["step"] == 1 else (2e-3, 1e-6)
        for key in ours & logged:
            assert z[key] == pytest.approx(d[key], rel=rel, abs=floor), (z["step"], key)
        # the controller's decision, from the knee pooled so far: the same number
        assert (z[decision], z[updates]) == (d[decision], d[updates])
    assert [e[decision] for e in sharded] == [3.0] + [6.0] * (STEPS - 1)
    assert any(e["otb/groups/mixed_rewards_fraction"] == 0 for e in plain)  # the case above ran


@pytest.mark.torchrun
@pytest.mark.external
def test_zero3_applies_the_controllers_updates_as_ddp(zero3: Path, ddp: Path) -> None:
    """The gate under DeepSpeed: the same update boundaries on both processes as under DDP, no
    optimizer step inside an update (the parameters unchanged after its first batch), TRL's
    gradient norm logged once an update (at its last batch, the norm of the whole update) and
    equal to DDP's, and the parameters after every step DDP's."""
    histories, plain = ranks(zero3), ranks(ddp)
    assert histories[0] == histories[1]
    boundaries = [(h["batches"], h["index"]) for h in histories[0]]
    assert boundaries == [(h["batches"], h["index"]) for h in plain[0]]
    sums = [h["sum"] for h in histories[0]]
    assert sums[1] == sums[2] != sums[3] == sums[4] != sums[5]  # no step at steps 3 and 5
    # round-off apart (6e-7 seen); one Adam step more or less moves the sum by ~1e-3 of it
    assert sums == pytest.approx([h["sum"] for h in plain[0]], rel=1e-5)
    normed = {e["step"]: e["grad_norm"] for e in trained(zero3) if "grad_norm" in e}
    reference = {e["step"]: e["grad_norm"] for e in trained(ddp) if "grad_norm" in e}
    assert sorted(normed) == sorted(reference) == [1, 2, 4, 6]
    assert normed == pytest.approx(reference, rel=1e-5, abs=1e-6)
