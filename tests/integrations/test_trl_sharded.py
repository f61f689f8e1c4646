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
float round-off. The same launches then train, each beside its twin, a LoRA policy with
`attach(advantages="otb")` (its energy caught from `generate` under ZeRO-3's `synced_gpus`, no
extra forward) and an `RLOOTrainer` at its defaults (a reference model, β·KL in its rewards):
both audited, with DDP's advantages at step 1 and DDP's metrics."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from controller_torchrun import STEPS, gated

from otb_diag.errors import InputError
from otb_diag.integrations.trl.advantages import EXTRA_FORWARD, check_swap
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
    settings |= {"fp16": False, "generation_batch_size": 8, "per_device_train_batch_size": 8}
    settings |= args
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


def test_attach_refuses_advantages_a_process_cannot_form_from_generates_forwards() -> None:
    """`attach(advantages=...)` forms each process's advantages from its own groups, and under
    sharding an energy baseline's energy only from `generate`'s forwards (a no-grad forward of
    one process's rows would be a collective it ran alone): refused where TRL generates
    otherwise; taken unsharded (one extra forward there) and for a baseline needing no energy."""
    otb, rloo = ("otb", {"handle_zero_tail": True}), ("rloo", {})
    grpo = SUPPORTED["GRPOTrainer"]
    straddling = trainer_like(per_device_train_batch_size=2, steps_per_generation=3)
    with pytest.raises(InputError, match="generates 6 completions a batch .* a group would"):
        check_swap(straddling, otb, grpo.audited(straddling))
    check_swap(straddling, ("grpo", {"eps": 1e-4}), ("grpo", {"eps": 1e-4}))  # TRL's own: kept
    for setting, value, named in [
        ("use_vllm", True, "use_vllm=True"),
        ("use_transformers_continuous_batching", True, "continuous_batching=True"),
        ("rollout_func", print, "a rollout_func"),
        ("tools", [print], r"tools \(each tool turn a generate call of its own\)"),
        ("generation_config", SimpleNamespace(num_beams=2), "num_beams=2"),
    ]:
        sharded, plain = (trainer_like(zero=3, per_device_train_batch_size=4), trainer_like())
        for t in (sharded, plain):
            setattr(t, setting, value)
        with pytest.raises(InputError, match=f"{named} TRL does not .* would hang the training"):
            check_swap(sharded, otb, None)
        check_swap(sharded, rloo, None)  # no energy: nothing to catch
        check_swap(plain, otb, None)  # unsharded: one no-grad forward of its own rows


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


def as_ddp(sharded: list[dict], plain: list[dict]) -> None:
    """Every `otb/` key DDP logs but its all-parameter estimate's, at every step, equal to
    DDP's: to 1e-5 at step 1 (the same weights; the scores under ZeRO-3 from the gathered
    layer), and to 2e-3 relative (1e-6 absolute) on the later steps, whose weights differ at
    round-off (ZeRO-3 reduce-scatters and DDP all-reduces the gradients in other orders, and
    AdamW's normalisation lifts the round-off of near-zero gradient entries). On a step whose
    groups all have equal rewards the step's noise is 0 to round-off (its split ~1e-13), and
    whether the pooled window's intervals are defined there is round-off's: those bounds alone
    may be logged (finite) in one run and left out (not finite) in the other. The entries
    (TRL's log or attach's full record) hold `otb/groups/mixed_rewards_fraction`."""
    assert [e["step"] for e in sharded] == [e["step"] for e in plain]
    for z, d in zip(sharded, plain, strict=True):
        logged = {k for k in d if k.startswith("otb/") and not k.startswith(PARAMS)}
        ours = {k for k in z if k.startswith("otb/")}
        if d["otb/groups/mixed_rewards_fraction"] > 0:
            assert ours == logged, z["step"]
        else:  # no gradient in the batch: only interval bounds may differ in definedness
            assert all(k.endswith(("_low", "_high")) for k in ours ^ logged), ours ^ logged
        rel, floor = (1e-5, 1e-9) if z["step"] == 1 else (2e-3, 1e-6)
        for key in ours & logged:
            assert z[key] == pytest.approx(d[key], rel=rel, abs=floor), (z["step"], key)


@pytest.mark.torchrun
@pytest.mark.external
def test_zero3_logs_ddps_split_knee_and_controller_decisions(zero3: Path, ddp: Path) -> None:
    """The gated run: DDP's `otb/` keys and values (`as_ddp`), the split and the knee it pools
    at every step, and the controller's decisions DDP's."""
    sharded, plain = trained(zero3), trained(ddp)
    assert [e["step"] for e in sharded] == list(range(1, STEPS + 1))
    as_ddp(sharded, plain)
    controller = ("decided_prompts", "prompts_per_update", "updates")
    for z, d in zip(sharded, plain, strict=True):
        assert any(k.startswith("otb/split/grpo/") for k in z)  # the split, every step
        assert any(k.startswith("otb/budget/grpo/ema/") for k in z)  # the knee it pools
        # the controller's decision from the knee pooled so far, the prompts of the update as
        # applied, and the updates: DDP's numbers
        for key in (f"otb/controller/{name}" for name in controller):
            assert z[key] == d[key], (z["step"], key)
    # decided from the 2nd record (step 2), applied from the update that follows it (step 3)
    assert [e["otb/controller/decided_prompts"] for e in sharded] == [3.0] + [6.0] * (STEPS - 1)
    assert [e["otb/controller/prompts_per_update"] for e in sharded] == [3.0] * 2 + [6.0] * (
        STEPS - 2
    )
    assert any(e["otb/groups/mixed_rewards_fraction"] == 0 for e in plain)  # the case above ran


def full_record(out: Path) -> list[dict]:
    """attach's record of every metric of every measured step (`otb_metrics.jsonl`)."""
    return [json.loads(line) for line in (out / "otb_metrics.jsonl").read_text().splitlines()]


def beside_as_ddp(zero3: Path, ddp: Path, name: str) -> tuple[list[dict], list[dict]]:
    """The training `name` beside the gated one (controller_torchrun.py, `BESIDE`), under
    ZeRO-3 as under DDP: every parameter partitioned, each process's completions and the
    advantages that trained them at step 1 DDP's (equal: 0 apart here), every metric of the
    full record as DDP's (`as_ddp`), the audit agreeing at both steps to max |δ| = 0, at most
    20 `otb/` keys a step on the dashboard. Its ZeRO-3 runs: each process's recorded steps and
    the full record."""
    runs, twins = ranks(zero3 / name), ranks(ddp / name)
    assert [run["held"] for run in runs] == [0, 0]
    for run, twin in zip(runs, twins, strict=True):
        first, reference = run["steps"][0], twin["steps"][0]
        assert first["completion_ids"] == reference["completion_ids"]
        torch.testing.assert_close(
            torch.tensor(first["advantages"]), torch.tensor(reference["advantages"]),
            rtol=1e-6, atol=1e-7,
        )  # fmt: skip
    record = full_record(zero3 / name)
    as_ddp(record, full_record(ddp / name))
    assert [(r["otb/audit/agrees"], r["otb/audit/max_abs_diff"]) for r in record] == [(1, 0)] * 2
    for entry in trained(zero3 / name):
        assert 0 < sum(k.startswith("otb/") for k in entry) <= 20
    return runs, record


@pytest.mark.torchrun
@pytest.mark.external
def test_zero3_trains_a_lora_policy_with_otb_advantages_as_ddp(zero3: Path, ddp: Path) -> None:
    """`attach(advantages="otb")` on a LoRA policy under ZeRO-3: the energy of every step from
    `generate`'s own forwards (no extra forward), also where one process's `generate` ran
    past its own last token (`synced_gpus`: the processes' completions of a step differ in
    width), trained with DDP's advantages and audited (`beside_as_ddp`)."""
    runs, record = beside_as_ddp(zero3, ddp, "lora-otb")
    assert [r[EXTRA_FORWARD] for r in record] == [0.0, 0.0]
    widths = [[len(step["completion_ids"][0]) for step in run["steps"]] for run in runs]
    assert widths[0] != widths[1]  # the synced case ran


@pytest.mark.torchrun
@pytest.mark.external
def test_zero3_audits_rloo_with_its_reference_models_kl_as_ddp(zero3: Path, ddp: Path) -> None:
    """A default `attach` on an RLOOTrainer at its defaults under ZeRO-3: its reference
    model's log-probabilities caught from its generation (`kl_penalty.py`), so the audit
    agrees at step 2, whose rewards its β·KL shapes (TRL logs a KL above 0 there), with DDP's
    numbers (`beside_as_ddp`)."""
    beside_as_ddp(zero3, ddp, "rloo")
    assert [e["kl"] > 0 for e in trained(zero3 / "rloo")] == [False, True]


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
