"""`attach` across the configurations TRL 1.16 documents (issue 52), each on the embedded toy
(tests/integrations/trl_toy.py: one group of 4 completions a step, 1–2 steps): every `loss_type`
and `scale_rewards`, `multi_objective_aggregation`, a KL penalty, several iterations, sequence-
level importance sampling, masked truncations, gradient checkpointing, reward weights, the
top-entropy mask, OTB advantages, the knee controller, RLOOTrainer and LoRA.

Each configuration either works, trained to its end with the diagnostics on (no warning that
they switched off), at most 20 `otb/` keys a step, the split measured at step 1 under the
estimator that trains and OTB, and wherever TRL's advantages are a registry estimator the audit
agreeing every step (to max |δ| = 0 where the estimator is TRL's own arithmetic), or is refused
at `attach` with its reason, before anything changed. docs/live.md ("Tested configurations")
is this module's table. Beside the sweep: a LoRA policy at init (B = 0) trains its first step
with the plain policy's OTB advantages, bit for bit; a failure of the advantage swap stops the
training with one `AdvantageSwapError` naming the configuration."""

from __future__ import annotations

import json
import re
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import torch
from trl_toy import toy_trainer

from otb_diag.errors import InputError
from otb_diag.integrations.trl import advantages as swap_module
from otb_diag.integrations.trl import attach
from otb_diag.integrations.trl.advantages import AdvantageSwapError
from otb_diag.io.trainers.trl import OTB_RECORD

pytestmark = pytest.mark.external  # runs TRL's trainers
peft = pytest.importorskip("peft")

PER_STEP = 8  # two groups of GENERATIONS = 4 completions a step (a batch's std is not a group's)
# Prompts the toy answers right about half the time at τ = 1 (found by sampling 8 completions of
# 36): the groups' rewards differ, so the audit compares advantages that are not all 0.
MIXED = ["R:767=", "R:499=", "R:543=", "S:334=", "S:425=", "S:556="]
KEYS_A_STEP = 20  # `otb/` keys on the dashboard a step, at most (`metric_levels.HEADLINE`)


@dataclass(frozen=True)
class Case:
    """One configuration: the toy's settings (GRPOConfig or RLOOConfig fields; `rloo`; `lora`,
    the adapted modules of a LoRA; `prompt_tuning`, the virtual tokens of a prompt tuning),
    attach's options, the registry estimator its advantages are (None: none, no audit logged),
    whether the audit finds max |δ| = 0, and for a refused one the reason attach gives."""

    trainer: dict[str, Any] = field(default_factory=dict)
    attach: dict[str, Any] = field(default_factory=dict)
    audited: str | None = "grpo"
    exact: bool = True
    steps: int = 1
    refused: str | None = None
    measured: tuple[int, ...] | None = None  # the steps that log `otb/` keys (None: all)


LORA = {"lora": ["c_attn"]}  # GRPOTrainer(peft_config=LoraConfig(r=4, target_modules=...))
CASES = {
    "defaults": Case(),  # loss_type="dapo", scale_rewards="group"
    **{
        f"loss_type={loss}": Case({"loss_type": loss})
        for loss in ("grpo", "bnpo", "dr_grpo", "cispo", "sapo", "luspo", "vespo")
    },
    "scale_rewards=none": Case({"scale_rewards": "none"}, audited="grpo-unscaled"),
    "scale_rewards=batch": Case({"scale_rewards": "batch"}, audited="grpo-batch"),
    "normalize_then_sum": Case({"multi_objective_aggregation": "normalize_then_sum"}, audited=None),
    "beta=0.04": Case({"beta": 0.04}),
    # the batch of step 1 trains again at step 2, measured once, at step 1
    "num_iterations=2": Case({"num_iterations": 2}, steps=2, measured=(1,)),
    "importance_sampling_level=sequence": Case({"importance_sampling_level": "sequence"}),
    "mask_truncated_completions": Case({"mask_truncated_completions": True}),
    "gradient_checkpointing": Case({"gradient_checkpointing": True}),
    "reward_weights=[1, 0.5]": Case({"reward_weights": [1.0, 0.5]}),
    "top_entropy_quantile=0.5": Case(
        {"top_entropy_quantile": 0.5}, refused="split weighs every completion token"
    ),
    "top_entropy_quantile=0.5, split_every=None": Case(
        {"top_entropy_quantile": 0.5}, {"split_every": None}
    ),
    "advantages=otb": Case(attach={"advantages": "otb"}, audited="otb"),
    "controller=knee": Case(attach={"controller": "knee"}, steps=2),
    "controller=knee, scale_rewards=none": Case(
        {"scale_rewards": "none"}, {"controller": "knee"}, audited="grpo-unscaled", steps=2
    ),
    "controller=knee, normalize_then_sum": Case(
        {"multi_objective_aggregation": "normalize_then_sum"},
        {"controller": "knee"},
        refused="controller='knee' reads the knee of the estimator",
    ),  # fmt: skip
    "controller=knee, num_iterations=2": Case(
        {"num_iterations": 2}, {"controller": "knee"}, refused="trains each batch several times"
    ),
    # β·KL shapes the rewards from step 2 on (at step 1 the policy is the reference)
    "RLOO defaults (beta=0.05)": Case({"rloo": True}, audited="rloo", exact=False, steps=2),
    "RLOO beta=0": Case({"rloo": True, "beta": 0.0}, audited="rloo", exact=False),
    "RLOO normalize_advantages": Case({"rloo": True, "normalize_advantages": True}, audited=None),
    "RLOO advantages=otb": Case(
        {"rloo": True}, {"advantages": "otb"}, refused="trains a trl.GRPOTrainer"
    ),
    "LoRA": Case(LORA),
    "LoRA, advantages=otb": Case(LORA, {"advantages": "otb"}, audited="otb"),
    "prompt tuning": Case({"prompt_tuning": 2}, refused="(PROMPT_TUNING) adds virtual tokens"),
}


def build(case: Case, out: Path) -> Any:
    """The toy trainer of `case` writing to `out`: small completions, `case.steps` steps."""
    settings = {k: v for k, v in case.trainer.items() if k not in ("lora", "prompt_tuning")}
    if "lora" in case.trainer:
        settings["peft_config"] = peft.LoraConfig(r=4, target_modules=case.trainer["lora"])
    if "prompt_tuning" in case.trainer:
        settings["peft_config"] = peft.PromptTuningConfig(
            task_type="CAUSAL_LM", num_virtual_tokens=case.trainer["prompt_tuning"]
        )
    return toy_trainer(
        out, case.steps, per_step=PER_STEP, prompts=MIXED, max_completion_length=8, **settings
    )


@pytest.mark.parametrize("name", list(CASES))
def test_attach_works_or_refuses_with_its_reason(name: str, tmp_path: Path) -> None:
    case = CASES[name]
    trainer = build(case, tmp_path / "run")
    if case.refused is not None:
        before = dict(vars(trainer))
        with pytest.raises(InputError, match=re.escape(case.refused)):
            attach(trainer, **case.attach)
        assert vars(trainer).keys() == before.keys()  # nothing installed
        return
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        live = attach(trainer, **case.attach)
        trainer.train()
    said = [str(w.message) for w in caught if "otb-diag" in str(w.message)]
    assert not said, said  # the diagnostics stayed on
    assert live.enabled
    entries = [e for e in trainer.state.log_history if "loss" in e]
    assert [e["step"] for e in entries] == list(range(1, case.steps + 1))
    assert entries[0]["reward_std"] > 0  # advantages that are not all 0
    measured = case.measured or tuple(range(1, case.steps + 1))
    for entry in entries:
        keys = [k for k in entry if k.startswith("otb/")]
        assert 0 < len(keys) <= KEYS_A_STEP if entry["step"] in measured else not keys, keys
        if entry["step"] not in measured:
            continue
        if case.audited is None:
            assert "otb/audit/agrees" not in entry
            continue
        assert entry["otb/audit/agrees"] == 1.0
        if case.exact:
            assert entry["otb/audit/max_abs_diff"] == 0.0
    assert (live.audited or (None,))[0] == case.audited
    if case.attach.get("split_every", 10):  # the split at step 1, under what trains and OTB
        first = json.loads((tmp_path / "run" / OTB_RECORD).read_text().splitlines()[0])
        split = [k.split("/") for k in first if k.startswith("otb/split/")]
        measured = {parts[2] for parts in split if len(parts) == 4}  # otb/split/<baseline>/…
        assert first["step"] == 1 and measured == {case.audited or "otb", "otb"}
    if live.gate is not None:
        assert live.gate.controller.estimator == case.audited


def first_advantages(trainer: Any) -> list[torch.Tensor]:
    """Record the advantages each generation batch trains with (outermost wrapper)."""
    seen: list[torch.Tensor] = []
    generate = trainer._generate_and_score_completions

    def recording(inputs: Any) -> dict:
        output = generate(inputs)
        seen.append(output["advantages"].detach().clone())
        return output

    trainer._generate_and_score_completions = recording
    return seen


def test_a_lora_policy_at_init_trains_with_the_plain_policys_otb_advantages(
    tmp_path: Path,
) -> None:
    """Same seed, LoRA at init (B = 0: the same policy, `W x + B A x` adds exact zeros): the
    first step's OTB advantages are the plain trainer's, bit for bit, their energy caught from
    `generate`'s own forwards through the PEFT wrapper (no extra forward); the LoRA run trains
    to its end, every step audited and agreeing, and moves its adapter only."""
    runs = {}
    for name, settings in (("plain", {}), ("lora", LORA)):
        trainer = build(Case(settings, steps=2), tmp_path / name)
        live = attach(trainer, advantages="otb", split_every=None)
        runs[name] = (trainer, first_advantages(trainer))
        trainer.train()
        assert live.swap.took_forward == 0.0  # W from generate's own forwards, under LoRA too
    (_, plain_seen), (lora, lora_seen) = runs["plain"], runs["lora"]
    assert torch.equal(lora_seen[0], plain_seen[0]) and lora_seen[0].abs().max() > 0
    audits = [e["otb/audit/max_abs_diff"] for e in lora.state.log_history if "loss" in e]
    assert audits == [0.0, 0.0]
    trained = {n for n, p in lora.model.named_parameters() if p.requires_grad}
    assert trained and all("lora_" in n for n in trained)


def test_a_failure_of_the_advantage_swap_names_the_configuration(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The swap cannot switch itself off as the diagnostics do: a failure inside it (planted)
    stops the training with one `AdvantageSwapError`, chained to the original, whose one
    paragraph names TRL's version and the settings, and points to the issue tracker."""

    def planted(*_: Any, **__: Any) -> None:
        raise RuntimeError("planted")

    monkeypatch.setattr(swap_module, "batch_advantages", planted)
    trainer = build(Case({"scale_rewards": "none", **LORA}), tmp_path / "run")
    attach(trainer, advantages="otb", split_every=None)
    with pytest.raises(AdvantageSwapError) as raised:
        trainer.train()
    message = str(raised.value)
    assert isinstance(raised.value.__cause__, RuntimeError)
    for part in (
        "could not form step 1's advantages, so the training stops: RuntimeError: planted",
        "TRL 1.16", "GRPOTrainer", "loss_type='dapo'", "scale_rewards='none'",
        "num_generations=4", "peft=LORA", "precision=fp32", "processes=1",
        "issue tracker", "attach(trainer) without advantages=",
    ):  # fmt: skip
        assert part in message, part
    assert "\n" not in message


def test_rloos_audit_needs_its_kl_shaped_rewards(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """RLOOTrainer's default β = 0.05 shapes its rewards, `R − β·KL`. At step 2 the policy has
    moved off the reference (TRL logs a KL ≠ 0); without the penalty (planted: 0) the rewards
    handed to the audit are the raw ones and the audit of that step disagrees, so the sweep's
    agreeing RLOO row does test the penalty."""
    from otb_diag.integrations.trl.kl_penalty import KlPenalty

    monkeypatch.setattr(KlPenalty, "penalty", lambda self, mask: torch.zeros(len(mask)))
    trainer = build(Case({"rloo": True}, steps=2), tmp_path / "run")
    attach(trainer, split_every=None)
    trainer.train()
    entries = [e for e in trainer.state.log_history if "loss" in e]
    assert entries[0]["kl"] == 0.0 and entries[1]["kl"] != 0.0
    assert [e["otb/audit/agrees"] for e in entries] == [1.0, 0.0]
