"""The knee controller in a real TRL `GRPOTrainer` (`integrations/trl/update_gate.py`): an update
of k generation batches is the mean of the k batches' gradients, clipped as one; the optimizer,
the scheduler and the zero-grad step once an update; the controller's decisions reach the
gate, are logged (the collapse watch reading the norms of applied updates only), and what the
gate cannot do is refused."""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
from controller_torchrun import STEPS, gated
from transformers import TrainerCallback
from trl_toy import toy_trainer

from otb_diag.errors import InputError
from otb_diag.integrations.core import controller as controller_module
from otb_diag.integrations.trl import attach

pytestmark = pytest.mark.external  # runs TRL's trainer


class Recorder(TrainerCallback):
    """Each TRL step's gradients as the optimizer is about to see them, and the parameters and
    the scheduler's step count after it."""

    def __init__(self, trainer: Any) -> None:
        self.trainer = trainer
        self.grads: list[torch.Tensor] = []
        self.params: list[torch.Tensor] = []
        self.scheduled: list[int] = []

    def flat(self, grads: bool) -> torch.Tensor:
        model = self.trainer.model
        parts = [(p.grad if grads else p).detach().flatten() for p in model.parameters()]
        return torch.cat([x if x is not None else torch.zeros(0) for x in parts]).clone()

    def on_pre_optimizer_step(self, args: Any, state: Any, control: Any, **_: Any) -> None:
        self.grads.append(self.flat(grads=True))

    def on_step_end(self, args: Any, state: Any, control: Any, **_: Any) -> None:
        self.params.append(self.flat(grads=False))
        self.scheduled.append(self.trainer.lr_scheduler.last_epoch)


def recorded(folder: Path, gate_batches: int, **config: Any) -> tuple[Recorder, Any]:
    """Two TRL steps of the toy; with `gate_batches`, under the controller with k fixed to it
    from the first update (the rule's warm-up keeps it there)."""
    trainer = toy_trainer(folder, 2, temperature=2.0, **config)  # both batches carry a signal
    live = attach(trainer, controller="knee", split_every=1) if gate_batches else None
    if live is not None:
        live.gate.batches = gate_batches
        live.core.controller.prompts = gate_batches * live.core.controller.rule.base
    recorder = Recorder(trainer)
    trainer.add_callback(recorder)
    start = recorder.flat(grads=False)
    trainer.train()
    return recorder, start


def test_an_update_of_two_batches_is_their_mean_gradient_clipped_as_one(tmp_path: Path) -> None:
    """The reference takes the same two batches (learning rate 0: the weights that sample the
    second are the first's, as under the gate) one optimizer call each, unclipped: the gate's
    update is the clipped mean of their gradients, and its first batch is neither clipped,
    stepped, scheduled nor zeroed."""
    clip = 0.05
    reference, _ = recorded(tmp_path / "ref", 0, learning_rate=0.0, max_grad_norm=1e9)
    g1, g2 = reference.grads
    mean = (g1 + g2) / 2
    assert mean.norm() > 2 * clip and g1.norm() / 2 > clip  # clipping would show
    gated, start = recorded(tmp_path / "gated", 2, learning_rate=1e-3, max_grad_norm=clip)
    first, second = gated.grads
    torch.testing.assert_close(first, g1 / 2, rtol=1e-5, atol=1e-8)  # accumulated, unclipped
    torch.testing.assert_close(second, mean * clip / mean.norm(), rtol=1e-4, atol=1e-8)
    assert torch.equal(gated.params[0], start)  # no optimizer step after the first batch
    assert not torch.equal(gated.params[1], start)
    assert gated.scheduled == [0, 1] and reference.scheduled == [1, 2]


@pytest.mark.parametrize("advantages", [None, "otb"])
def test_the_controllers_decisions_are_realised_and_logged(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, advantages: str | None
) -> None:
    """A rule that decides 2 base batches from its second record on: step 1 is an update of
    one batch, then every update takes two (steps 2-3 and 4-5 are one update each, as the
    decision of step 1 is known at its end); each step logs the prompts of the update it
    trains in, as applied, and the decision beside them. The record it reads is the knee of
    the estimator that trains: TRL's GRPO, or OTB once `advantages="otb"` swaps it in (it
    read GRPO's, no longer pooled, and never decided). The gated optimizer step keeps torch's
    scheduler mark: no warning that it was overridden (issue 53), nor any other of torch's
    scheduler's."""

    def scheduled(self: Any, knee: Any, current: int, records: int) -> int:
        return 2 * self.base if records >= 1 else current

    monkeypatch.setattr(controller_module.KneeRule, "decide", scheduled)
    trainer = toy_trainer(tmp_path / "run", 5)
    live = attach(trainer, controller="knee", split_every=1, advantages=advantages)
    assert live.core.controller.estimator == (advantages or "grpo")
    steps: list[int] = []
    optimizer_steps = 0
    original = trainer.create_optimizer

    def counting(*args: Any, **kwargs: Any) -> Any:
        optimizer = original(*args, **kwargs)
        step = optimizer.step

        def counted(*a: Any, **k: Any) -> Any:
            nonlocal optimizer_steps
            optimizer_steps += 1
            steps.append(trainer.state.global_step + 1)
            return step(*a, **k)

        optimizer.step = counted
        return optimizer

    trainer.create_optimizer = counting
    watched: list[int] = []  # the steps whose grad_norm the collapse watch took
    add = live.core.add_grad_norm
    live.core.add_grad_norm = lambda step, value: (watched.append(step), add(step, value))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.train()
    scheduler = [str(w.message) for w in caught if "lr_scheduler" in str(w.message)]
    assert not scheduler and not [w for w in caught if "overridden" in str(w.message)]
    base = live.core.controller.rule.base
    assert base == 2  # 8 completions in groups of 4
    assert steps == [1, 3, 5] and optimizer_steps == 3
    normed = [e["step"] for e in trainer.state.log_history if "grad_norm" in e]
    assert normed == steps  # TRL logs the applied updates' norms, not the partial sums between
    assert watched == steps  # and the collapse watch reads those
    history = trainer.state.log_history[:-1]
    applied = [e["otb/controller/prompts_per_update"] for e in history]
    assert applied == [2.0, 4.0, 4.0, 4.0, 4.0]  # step 1's update of one batch, then of two
    assert [e["otb/controller/decided_prompts"] for e in history] == [4.0] * 5  # from record 1
    assert live.core.controller.updates == 3


def test_the_gate_refuses_what_it_cannot_drive(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="num_iterations=2 trains each batch several times"):
        attach(toy_trainer(tmp_path / "a", 1, num_iterations=2), controller="knee")
    with pytest.raises(InputError, match="generates every 2 micro-steps and steps every 1"):
        attach(toy_trainer(tmp_path / "b", 1, steps_per_generation=2), controller="knee")
    with pytest.raises(InputError, match="fp16's loss scaler unscales them at every step"):
        attach(toy_trainer(tmp_path / "e", 1, fp16=True, use_cpu=False), controller="knee")
    with pytest.raises(InputError, match="which split_every=None switches off"):
        attach(toy_trainer(tmp_path / "c", 1), controller="knee", split_every=None)
    with pytest.raises(InputError, match="controller must be None or one of 'knee'"):
        attach(toy_trainer(tmp_path / "d", 1), controller="adaptive")


@pytest.mark.torchrun
def test_two_processes_apply_the_main_processs_decision_together(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """2 gloo processes, groups straddling them: each applies the main process's decision at
    the same update boundary (k = 1 for steps 1 and 2, whose end decides 2 batches; then
    updates of steps 3-4 and 5-6), their parameters stay equal, and the main process logs the
    decision. (The launch is shared with test_trl_sharded.py, which sets ZeRO-3's beside it.)"""
    tmp_path, result = gated(tmp_path_factory)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "switched off" not in result.stderr, result.stderr[-3000:]
    histories = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert histories[0] == histories[1]
    # after each step's end: the k of the next batch's update and its index in it
    assert len(histories[0]) == STEPS
    assert [(h["batches"], h["index"]) for h in histories[0]] == [
        (1, 0), (2, 0), (2, 1), (2, 0), (2, 1), (2, 0)
    ]  # fmt: skip
    sums = [h["sum"] for h in histories[0]]  # equal in both processes, as the histories are
    assert sums[1] == sums[2] != sums[3] == sums[4] != sums[5]  # no step at steps 3 and 5
    log = json.loads((tmp_path / "log_history.json").read_text())
    steps = [e for e in log if "loss" in e]
    applied = [e["otb/controller/prompts_per_update"] for e in steps]
    assert applied == [3.0, 3.0, 6.0, 6.0, 6.0, 6.0]  # base: 12 rows in groups of 4
    assert [e["otb/controller/decided_prompts"] for e in steps] == [3.0] + [6.0] * 5
