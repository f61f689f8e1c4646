"""`attach(trainer, advantages=...)` on a real TRL `GRPOTrainer` (CPU, embedded checkpoint),
tested as training: one step's gradient is that of the surrogate loss built by hand from the
step's rows and the registry's OTB advantages (verl's calling convention); `advantages="grpo"`
under TRL's documented settings trains bit for bit as TRL alone; any registered baseline trains
with the registry's numbers, with its options; the dumped steps record the estimator, and
`otb-diag energy --model-free` audits the advantages that trained against it, unasked."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from otb_diag.cli.main import app
from trl_toy import toy_trainer
from typer.testing import CliRunner

from otb_diag.errors import InputError
from otb_diag.integrations.trl import attach
from otb_diag.integrations.trl.advantages import EXTRA_FORWARD
from otb_diag.io.loading import load_rollouts
from otb_diag.io.rollouts.to_batch import make_batch
from otb_diag.io.scenarios import default_checkpoint
from otb_diag.maths.energy.token_stats import logged_stats
from otb_diag.maths.estimators.advantages import Estimator, batch_advantages
from otb_diag.maths.estimators.otb import verl_otb_advantage

pytestmark = pytest.mark.external  # runs TRL
runner = CliRunner()
STEPS = 3
# Gradients of the same loss from TRL's fused, chunked output layer and from full logits agree
# to float32 round-off of their sums: measured 1.2e-6 of a tensor's largest entry at worst
# (step 2 of this run, one thread). The gradient under TRL's own (grpo) advantages differs from
# OTB's by 2.7 times that entry.
GRAD_REL = 1e-5


class Recorder:
    """What each training step handed TRL's loss: the weights that generated the batch, the
    batch (with the advantages that trained) and the gradients before the optimizer's step."""

    def __init__(self, trainer: Any) -> None:
        from transformers import TrainerCallback

        self.weights: list[dict[str, torch.Tensor]] = []
        self.batches: list[dict[str, torch.Tensor]] = []
        self.grads: list[dict[str, torch.Tensor]] = []
        generate = trainer._generate_and_score_completions
        model = trainer.model

        def recording(inputs: Any) -> dict:
            self.weights.append({k: v.detach().clone() for k, v in model.state_dict().items()})
            output = generate(inputs)
            self.batches.append({k: v.clone() for k, v in output.items() if torch.is_tensor(v)})
            return output

        grads = self.grads

        class Grads(TrainerCallback):
            def on_pre_optimizer_step(self, args: Any, state: Any, control: Any, **_: Any):
                grads.append({n: p.grad.detach().clone() for n, p in model.named_parameters()})

        trainer._generate_and_score_completions = recording
        trainer.add_callback(Grads())


def otb_run(out: Path, **options: Any) -> tuple[Any, Recorder]:
    """STEPS steps with `advantages="otb"` (no gradient clipping, so the gradient is the loss's),
    every step dumped; the trainer and what its first step handed the loss."""
    trainer = toy_trainer(out, STEPS, max_grad_norm=0.0)
    attach(
        trainer, dump_dir=out / "otb", split_every=None, advantages="otb", metrics="all", **options
    )
    recorder = Recorder(trainer)
    trainer.train()
    return trainer, recorder


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any, Recorder]:
    out = tmp_path_factory.mktemp("trl-otb") / "otb-toy"
    trainer, recorder = otb_run(out)
    return out, trainer, recorder


def step_rows(out: Path, step: int):
    return make_batch(load_rollouts(out / "otb" / f"step_{step:06d}.jsonl"))


def hand_logprobs(model: Any, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """log p and Σπ² `[B, C]` of the completion tokens from full logits (τ = 1)."""
    ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], 1)
    attention = torch.cat([batch["prompt_mask"], batch["completion_mask"]], 1)
    c = batch["completion_ids"].shape[1]
    logits = model(input_ids=ids, attention_mask=attention).logits[:, -c - 1 : -1].float()
    logp = logits.log_softmax(-1)
    token = logp.gather(-1, batch["completion_ids"][..., None])[..., 0]
    return token, logp.exp().pow(2).sum(-1)


def test_one_step_is_the_gradient_of_the_hand_built_otb_surrogate(trained) -> None:
    """Every step: the advantages TRL trained on are verl's OTB of the dumped rows (the
    policy's log p and Σπ² that sampled them, the rewards, the groups), bit for bit. The first
    step with mixed rewards in a group (an update that is not round-off): its log p are those of
    the weights that sampled it, and TRL's gradient is that of −Σ_{i,t} m A_t log π(y_t) / Σ m
    (its dapo loss at ratio 1) with those advantages, to float32 round-off."""
    from transformers import AutoModelForCausalLM

    out, _, recorder = trained
    assert len(recorder.batches) == len(recorder.grads) == STEPS
    for step, x in enumerate(recorder.batches, 1):
        rows = step_rows(out, step)
        width = rows.mask.shape[1]
        verl, _ = verl_otb_advantage(
            rows.token_rewards, rows.mask, rows.group, rows.logprobs, rows.sum_pi2
        )
        assert x["advantages"].shape == x["completion_ids"].shape  # token level, [B, C]
        assert torch.equal(x["advantages"][:, :width], verl), step
        assert not x["advantages"][:, width:].any()
    step = next(s for s, x in enumerate(recorder.batches, 1) if x["advantages"].abs().max() > 0.1)
    x, grads, rows = recorder.batches[step - 1], recorder.grads[step - 1], step_rows(out, step)
    width = rows.mask.shape[1]
    model = AutoModelForCausalLM.from_pretrained(default_checkpoint())
    model.load_state_dict(recorder.weights[step - 1])  # the weights that sampled the step
    logp, sum_pi2 = hand_logprobs(model, x)
    mask = x["completion_mask"].float()
    on = rows.mask.bool()
    assert torch.allclose(rows.logprobs[on], logp[:, :width][on], atol=1e-5)
    assert torch.allclose(rows.sum_pi2[on], sum_pi2[:, :width][on], atol=1e-5)

    def surrogate_grads(advantages: torch.Tensor) -> dict[str, torch.Tensor]:
        model.zero_grad()
        token_logp, _ = hand_logprobs(model, x)
        loss = -(mask * advantages * token_logp).sum() / mask.sum()  # ∇ = −Σ m A ∇log π / Σ m
        loss.backward()
        return {n: p.grad.detach().clone() for n, p in model.named_parameters()}

    hand = surrogate_grads(x["advantages"])
    assert hand.keys() == grads.keys()
    for name, g in hand.items():
        tol = GRAD_REL * float(g.abs().max())
        assert float((grads[name] - g).abs().max()) <= tol, name
    grpo = surrogate_grads(_trl_grpo(rows))
    moved = max(float((grpo[n] - g).abs().max() / g.abs().max()) for n, g in hand.items())
    assert moved > 100 * GRAD_REL  # the test tells OTB's update from GRPO's


def _trl_grpo(rows: Any) -> torch.Tensor:
    """TRL's own advantages of these rows, `[B, 1]` (what training without the swap uses)."""
    r = rows.reward.view(-1, 4)
    return ((r - r.mean(1, keepdim=True)) / (r.std(1, keepdim=True) + 1e-4)).view(-1, 1)


def test_every_step_trains_with_otb_and_the_dump_audits_it(trained, tmp_path: Path) -> None:
    """At every step the logged audit checks the OTB advantages that trained and agrees;
    `energy --model-free` on the dump, unasked, audits them against OTB (the estimator each
    row records) and finds them equal to the last bit; named another estimator, it disagrees."""
    out, trainer, _ = trained
    entries = [e for e in trainer.state.log_history if "otb/audit/agrees" in e]
    assert [e["step"] for e in entries] == list(range(1, STEPS + 1))
    for e in entries:
        assert e["otb/audit/agrees"] == 1.0 and e["otb/audit/max_abs_diff"] == 0.0
        assert e[EXTRA_FORWARD] == 0.0  # W from generate's own forwards: no extra one
        assert e["otb/sum_pi2_from_loss_logits"] == 0.0  # nor the loss's: those that trained
    rows = json.loads((out / "otb" / "step_000001.jsonl").read_text().splitlines()[0])
    assert rows["advantage_estimator"] == {"baseline": "otb", "options": {"handle_zero_tail": True}}
    summary = energy(out / "otb", tmp_path / "audit", "--model-free")
    audit = summary["advantage_audit"]
    assert (audit["baseline"], audit["agrees"], audit["max_abs_diff"]) == ("otb", True, 0.0)
    assert audit["responses"] == 8 * STEPS
    other = energy(out / "otb", tmp_path / "rloo", "--model-free", "--trainer-baseline", "rloo")
    assert other["advantage_audit"]["agrees"] is False


def energy(rollouts: Path, out: Path, *extra: str) -> dict:
    args = ["energy", "--rollouts", str(rollouts), "--out", str(out), "--quiet", *extra]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    return json.loads((out / "summary.json").read_text())


def test_grpo_trains_bit_for_bit_as_trl_alone(tmp_path: Path) -> None:
    """TRL's documented settings: `advantages="grpo"` is TRL's estimator (ε = 1e-4); the run
    ends on the weights of TRL alone, bit for bit, and its audit agrees at every step."""
    swapped = toy_trainer(tmp_path / "swapped", STEPS)
    attach(swapped, split_every=None, advantages="grpo")
    swapped.train()
    plain = toy_trainer(tmp_path / "plain", STEPS)
    plain.train()
    for name, value in plain.model.state_dict().items():
        assert torch.equal(value, swapped.model.state_dict()[name]), name
    audits = [e["otb/audit/agrees"] for e in swapped.state.log_history if "otb/audit/agrees" in e]
    assert audits == [1.0] * STEPS


@pytest.mark.parametrize(
    ("name", "options"),
    [("rloo", None), ("otb", {"handle_zero_tail": False}), ("optseq", {"eps": 1e-6})],
)
def test_a_registry_baseline_trains_with_its_options(
    tmp_path: Path, name: str, options: dict | None
) -> None:
    """Each step's advantages (dumped as they trained) are the registry's under the options
    given, on the dumped rows; the rows record both, and the logged audit agrees."""
    trainer = toy_trainer(tmp_path / name, 2)
    live = attach(
        trainer, dump_dir=tmp_path / "otb", split_every=None, advantages=name,
        advantage_options=options,
    )  # fmt: skip
    trainer.train()
    for step in (1, 2):
        rows = step_rows(tmp_path, step)
        w = logged_stats(rows).w
        expected = batch_advantages(rows, w, [name], Estimator(options=options)).by_baseline[name]
        assert torch.equal(rows.trainer_advantage, expected * rows.valid), (name, step)
    record = json.loads((tmp_path / "otb" / "step_000001.jsonl").read_text().splitlines()[0])
    wanted = {"handle_zero_tail": True} if name == "otb" else {}
    assert record["advantage_estimator"] == {"baseline": name, "options": wanted | (options or {})}
    # A split, when logged, is under the estimator that trains (its options) and OTB.
    assert live.core.split_under == {"otb": {}} | {name: wanted | (options or {})}
    audits = [e["otb/audit/agrees"] for e in trainer.state.log_history if "otb/audit/agrees" in e]
    assert audits == [1.0, 1.0]


def test_bad_advantages_are_refused_before_anything_changes(tmp_path: Path) -> None:
    trainer = toy_trainer(tmp_path / "run", 1)
    before = dict(vars(trainer))
    with pytest.raises(InputError, match="unknown baseline 'otbb'; known baselines: none, mean"):
        attach(trainer, advantages="otbb")
    with pytest.raises(InputError, match="'rloo' takes no option 'eps'; it takes none"):
        attach(trainer, advantages="rloo", advantage_options={"eps": 1e-3})
    with pytest.raises(InputError, match="'otb' takes no option 'tail'; it takes eps, handle_zero"):
        attach(trainer, advantages="otb", advantage_options={"tail": False})
    with pytest.raises(InputError, match="advantages must be a registry baseline's name; got 3"):
        attach(trainer, advantages=3)
    assert vars(trainer).keys() == before.keys()  # no hook installed


def test_a_users_own_baseline_trains_and_its_dump_is_audited(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A baseline registered by the user (OTB weighted by W²) trains like a built-in one, and
    `energy --model-free` on its dump, in the same process, audits it unasked and agrees."""
    from otb_diag.maths.estimators import registry
    from otb_diag.maths.estimators.otb import otb_baseline

    name = "otb-squared-user"
    monkeypatch.setitem(registry.BASELINES, name, None)  # teardown removes the name again
    del registry.BASELINES[name]

    @registry.register_baseline(name, needs_energy=True, default=False)
    def otb_squared(returns, mask, group, energy, *, tir=False):
        """OTB weighted by W_t² instead of W_t: a baseline the package does not ship."""
        return otb_baseline(returns, mask, group, energy.square(), tir=tir)

    trainer = toy_trainer(tmp_path / "run", 2)
    attach(trainer, dump_dir=tmp_path / "otb", split_every=None, advantages=name, metrics="all")
    trainer.train()
    for step in (1, 2):
        rows = step_rows(tmp_path, step)
        expected = batch_advantages(rows, logged_stats(rows).w, [name]).by_baseline[name]
        assert torch.equal(rows.trainer_advantage, expected), step
    audit = energy(tmp_path / "otb", tmp_path / "audit", "--model-free")["advantage_audit"]
    assert (audit["baseline"], audit["agrees"], audit["max_abs_diff"]) == (name, True, 0.0)
