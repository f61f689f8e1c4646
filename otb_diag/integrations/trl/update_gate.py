"""The knee controller's decision realised in TRL without rebuilding the trainer:
`attach(trainer, controller="knee")` accumulates the gradients of k generation batches into one
optimizer update, k set by `core/controller.py:KneeController` from the pooled knee.

One TRL step is one generation batch of P₀ prompts (its micro-steps; TRL's `global_step`
counts them). The gate wraps, on the trainer's instances once `train()` has built them:

    the loss          each batch's `_compute_loss` divided by k: the update is the mean of the
                      k batches' gradients (each already the mean over its own rows)
    clipping          `_clip_grad_norm` only at the update's last batch, on the whole update
    the logged norm   `_get_grad_norm` only then too: TRL logs `grad_norm` once an update, the
                      norm of the update applied (on the other batches it would compute, with a
                      collective across processes, the norm of the partial sum)
    optimizer.step    only at the update's last batch
    scheduler.step    only then too: the learning-rate schedule counts updates
    model.zero_grad   only then: the gradients of the update's batches add up in `.grad`
    DeepSpeed         its engine accumulates, clips, steps the optimizer and the schedule
                      itself, inside `accelerator.backward` at the accumulation boundary that
                      accelerate sets from the trainer's micro-step (`DeepSpeedEngineWrapper.
                      backward`: `engine.set_gradient_accumulation_boundary`, then
                      `engine.step()`); the gate passes that boundary on only at the update's
                      last batch, so ZeRO-3 adds the k batches' reduced gradient partitions up
                      and takes one step of their sum, clipped as one (the wrappers above are
                      accelerate's no-ops there, or read the engine's norm)

so an update of k batches is the update of one batch of k · P₀ prompts (tested against it).
Each wrapper keeps what the wrapped function carries (`functools.wraps`): torch's learning-rate
scheduler marks the `optimizer.step` it wrapped (`_wrapped_by_lr_sched`) and warns, at its first
step, "Seems like `optimizer.step()` has been overridden after learning rate scheduler
initialization" where the mark is gone; with it kept, the gated step still calls the marked one,
which records for the scheduler that the optimizer stepped.
k changes only between updates: at an update's last batch, every process takes the main
process's decision (one collective of a small integer), so all processes apply the same one,
cut to the batches left before `max_steps`: the run's last update closes on its last batch
instead of leaving sampled batches in `.grad`, never applied (up to 7 of 8 batches of a k = 8
update). The controller is told the prompts of each update opened (`KneeController.applying`),
which every step of it logs as `otb/controller/prompts_per_update`; its decision is logged
beside, as `otb/controller/decided_prompts`.

What it cannot do, `check_gate` refuses: TRL's `num_iterations > 1` (a generation batch trained
several times, its updates interleaved with the next batch's), a generation batch that is not
one optimizer step (`steps_per_generation` ≠ `gradient_accumulation_steps`), fp16 (its loss
scaler unscales the gradients at every step), and DeepSpeed's ZeRO stages other than 3 (each
reduces its gradients on its own schedule at the boundary; only ZeRO-3 is tested against DDP,
tests/integrations/test_trl_sharded.py).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from torch import Tensor

from otb_diag.errors import InputError
from otb_diag.integrations.core.controller import KneeController
from otb_diag.runtime.torchrun import Dist


def check_gate(trainer: Any) -> int:
    """The base batch P₀ (prompts a generation batch, every process's) of a trainer the gate
    can drive; an `InputError` for one it cannot (module docstring)."""
    args = trainer.args
    if getattr(args, "num_iterations", 1) > 1:
        raise InputError(
            f"controller='knee' accumulates whole generation batches into one update, and "
            f"num_iterations={args.num_iterations} trains each batch several times.",
            hint="Use num_iterations=1 with the controller, or attach without it.",
        )
    if args.steps_per_generation != args.gradient_accumulation_steps:
        raise InputError(
            f"controller='knee' needs one generation batch an optimizer step; this trainer "
            f"generates every {args.steps_per_generation} micro-steps and steps every "
            f"{args.gradient_accumulation_steps}.",
            hint="Leave steps_per_generation and generation_batch_size unset (TRL then "
            "generates once a step).",
        )
    if args.fp16:
        raise InputError(
            "controller='knee' accumulates gradients across TRL's steps, and fp16's loss "
            "scaler unscales them at every step (its gradient norm), so the next batch's "
            "scaled gradients would add to unscaled ones.",
            hint="Train in bf16 (bf16=True) or fp32 with the controller.",
        )
    plugin = getattr(trainer.accelerator.state, "deepspeed_plugin", None)
    stage = getattr(plugin, "zero_stage", None)
    if getattr(trainer, "is_deepspeed_enabled", False) and stage != 3:
        raise InputError(
            f"controller='knee' holds DeepSpeed's accumulation boundary for k generation "
            f"batches, which is tested under ZeRO-3 only; this trainer runs ZeRO stage {stage}.",
            hint="Use ZeRO-3 with the controller, or attach without it under this stage.",
        )
    return args.generation_batch_size // trainer.num_generations


class UpdateGate:
    """Which batch of its update the current TRL step is (`index` of `batches`), and the
    wrappers of the module docstring. `controller` decides on the main process; `place` is this
    process's rank among the trainer's."""

    def __init__(self, trainer: Any, controller: KneeController, place: Dist) -> None:
        self.trainer = trainer
        self.controller = controller
        self.place = place
        self.batches = 1  # k of the current update
        self.index = 0  # the current batch within it

    @property
    def closing(self) -> bool:
        """The current batch is its update's last: the optimizer steps after it."""
        return self.index == self.batches - 1

    @property
    def opening(self) -> bool:
        """The current batch is its update's first: `.grad` held nothing before it."""
        return self.index == 0

    def scale(self, loss: Tensor) -> Tensor:
        """This batch's share of the update's loss."""
        return loss / self.batches if self.batches > 1 else loss

    def install(self) -> None:
        """Wrap the trainer's optimizer, scheduler, clipping, logged norm and zero-grad, and
        under DeepSpeed the accumulation boundary accelerate hands its engine (at
        `on_train_begin`: `train()` builds them)."""
        t = self.trainer
        t._clip_grad_norm = self._gated(t._clip_grad_norm)
        t._get_grad_norm = self._gated(t._get_grad_norm)
        t.optimizer.step = self._gated(t.optimizer.step)
        t.lr_scheduler.step = self._gated(t.lr_scheduler.step)
        t.model_wrapped.zero_grad = self._gated(t.model_wrapped.zero_grad)
        engine = getattr(t.accelerator, "deepspeed_engine_wrapped", None)  # set by `prepare`
        if engine is not None:
            backward = engine.backward

            def held(loss: Tensor, sync_gradients: bool = True, **kwargs: Any) -> Any:
                return backward(loss, sync_gradients=sync_gradients and self.closing, **kwargs)

            engine.backward = held

    def _gated(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fn)  # keeps torch's scheduler mark on `optimizer.step` (docstring)
        def gated(*args: Any, **kwargs: Any) -> Any:
            return fn(*args, **kwargs) if self.closing else None

        return gated

    def step_end(self) -> None:
        """Every process, at each TRL step's end (after the main process's metrics were
        collected): the next batch of the update, or the next update with the main process's
        decision."""
        if not self.closing:
            self.index += 1
            return
        self.controller.updated()
        decided = self.controller.batches if self.place.is_main else None
        self.batches = self.place.all_gather(decided)[0]
        state = self.trainer.state  # `global_step` counts this batch already
        left = state.max_steps - state.global_step
        if left > 0:
            self.batches = min(self.batches, left)
        self.index = 0
        self.controller.applying(self.batches * self.controller.rule.base)
