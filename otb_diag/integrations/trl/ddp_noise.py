"""The noise scale of all parameters under DDP, at no extra pass: McCandlish's two-batch
estimator (`maths/noise/two_batch.py`) read off the gradient all-reduce.

DDP hands each bucket of this process's gradient to a communication hook before it averages the
buckets over the processes (`DistributedDataParallel.register_comm_hook`). `DdpNoise.hook` adds
the bucket's squared norm (`|g_i|²`, the local gradient) to its sums, runs torch's own default
hook (`ddp_comm_hooks.default_hooks.allreduce_hook`: divide by the world size, all-reduce, the
very arithmetic of DDP without a hook, so no training number changes), and adds the squared norm
of the reduced bucket (`|g_big|²`). Under gradient accumulation DDP skips the all-reduce on the
micro-steps (`no_sync`) and hands the buckets over once, on the step's last backward, holding
the whole step's local gradient: one reading per optimizer step. At the step's end (`metrics`,
a collective every process runs) one float64 all-reduce averages `|g_i|²` over the processes.

The batch unit is the prompt, as in the split's `P`: `B_small` = the prompts a process trains on
per optimizer step (its rows / N), `B_big` = W · B_small; a process's groups must be whole (as
`attach`'s other metrics require). The estimator takes the local gradients as means over their
own prompts, which TRL's loss gives under sequence-level aggregation; under token-level
normalisation by the global token count the local gradient is a token-weighted mean, and the
estimate is that of token-weighted prompts (docs/live.md).

Not available where there is no DDP all-reduce of whole gradients (`attach` warns once, at
the training's start, saying why: `WITHOUT_DDP`), and on a single process, which has one batch
size only."""

import warnings
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

from otb_diag.integrations.trl.update_gate import UpdateGate
from otb_diag.maths.noise.budget_stream import SPLIT
from otb_diag.maths.noise.two_batch import two_batch_noise

NAME = "params"  # logged as otb/split/params/<field>, beside the head-mode split's baselines
# Why the estimate is not logged, by accelerate's `distributed_type` (docs/live.md)
WITHOUT_DDP = {
    "DEEPSPEED": "DeepSpeed's engine reduces each micro-step's gradients as its backward "
    "produces them (ZeRO-3 reduce-scatters them into each process's partition and sums them "
    "there over the micro-steps), so no process holds its own step's gradient to read",
    "FSDP": "FSDP reduce-scatters each layer's gradients inside its backward, where no DDP "
    "comm hook sees them; FSDP2's set_custom_reduce_scatter is where a process's step "
    "gradient could be read, which otb-diag does not do yet",
}


def _squared(t: Tensor) -> Tensor:
    """`|t|²` as a float64 scalar on t's device (no float32 round-off over millions of terms)."""
    return torch.linalg.vector_norm(t, dtype=torch.float64).square()


class DdpNoise:
    """The squared norms of one optimizer step's local and all-reduced gradients, from DDP's
    comm hook; `b_small` prompts per process, `world` processes."""

    def __init__(self, b_small: float, world: int, group: Any = None) -> None:
        self.b_small = b_small
        self.world = world
        self.group = group
        self._local: list[Tensor] = []  # |bucket|² before the all-reduce, one a bucket
        self._reduced: list[Tensor] = []  # |bucket|² after

    def hook(self, state: Any, bucket: dist.GradBucket) -> torch.futures.Future[Tensor]:
        """A DDP comm hook: the default all-reduce, the bucket's two squared norms beside it."""
        self._local.append(_squared(bucket.buffer()))
        reduced = allreduce_hook(state, bucket)

        def read(fut: torch.futures.Future[Tensor]) -> Tensor:
            value = fut.value()
            self._reduced.append(_squared(value))  # list.append: atomic, whatever the thread
            return value

        return reduced.then(read)

    def metrics(self, scale: float = 1.0) -> dict[str, float]:
        """`|G|²`, `tr Σ` (per prompt) and the two batch sizes of the step the hook saw, as
        `split/params/<name>`; {} when no backward synced since the last call. `scale`: what
        the squared norms are multiplied by (k² where the loss was divided by k,
        `update_gate.py`). A collective: every process calls it at the same point (the step's
        end)."""
        if not self._local:
            return {}
        local = torch.stack(self._local).sum()
        big_sq = scale * float(torch.stack(self._reduced).sum())  # the same g_big everywhere
        self._local, self._reduced = [], []
        dist.all_reduce(local, group=self.group)  # Σ_i |g_i|²
        small_sq = scale * float(local) / self.world
        b_big = self.world * self.b_small
        est = two_batch_noise(small_sq, big_sq, self.b_small, b_big)
        values = {"grad_sq": est.grad_sq, "total": est.total, "small_sq": small_sq}
        values |= {"big_sq": big_sq, "prompts_small": self.b_small, "prompts_big": b_big}
        return {f"{SPLIT}{NAME}/{k}": float(v) for k, v in values.items()}


def install_ddp_noise(
    trainer: Any, log: Callable[[dict[str, float]], None], gate: UpdateGate | None = None
) -> Any:
    """Register `DdpNoise` on the trainer's DDP model and hand its metrics
    (`otb/split/params/...`) to `log` at every optimizer step's end (`attach`'s: the
    dashboard's level, TRL's metric lists). Under the knee controller's `gate`, only the
    first batch of an update is measured (the others' buckets hold the update's sum so far),
    its norms scaled back by k². DDP exists only once
    `train()` has wrapped the model, so this waits for `on_train_begin`; without DDP (FSDP,
    DeepSpeed) it warns once and does nothing, and on one process it does nothing. Returns the
    trainer callback it adds; its `noise` is the registered `DdpNoise` (None before `train()`
    and without DDP), its `last` the step's metrics (`attach` pools them with the split's)."""
    from transformers import TrainerCallback

    class _Noise(TrainerCallback):
        noise: DdpNoise | None = None
        last: dict[str, float] = {}  # this step's `otb/split/params/...`, for the budget's pools

        def on_train_begin(self, args: Any, state: Any, control: Any, **_: Any) -> None:
            self.noise = self._guarded(_register, trainer)

        def on_step_end(self, args: Any, state: Any, control: Any, **_: Any) -> None:
            if self.noise is not None:
                k = gate.batches if gate is not None else 1
                metrics = self._guarded(self.noise.metrics, k**2) or {}
                if gate is not None and not gate.opening:
                    metrics = {}  # a collective all the same: every process called it
                self.last = {f"otb/{name}": value for name, value in metrics.items()}
                log(self.last)

        def _guarded(self, fn: Any, *args: Any) -> Any:
            """`fn(*args)`; on an error (a comm hook already registered, say), one warning and
            the estimate switched off: the training must not die of a diagnostic."""
            try:
                return fn(*args)
            except Exception as e:  # noqa: BLE001
                self.noise = None
                warnings.warn(
                    f"otb-diag: the all-parameter noise scale is switched off: "
                    f"{type(e).__name__}: {e}",
                    RuntimeWarning,
                    stacklevel=2,
                )
                return None

    callback = _Noise()
    trainer.add_callback(callback)
    return callback


def _register(trainer: Any) -> DdpNoise | None:
    """The hook on `trainer.model_wrapped` when it is DDP, else a one-time warning and None."""
    from torch.nn.parallel import DistributedDataParallel

    model = trainer.model_wrapped
    kind = str(getattr(trainer.accelerator, "distributed_type", "NO")).split(".")[-1]
    if not isinstance(model, DistributedDataParallel):
        if trainer.accelerator.num_processes > 1:  # a single process has nothing to compare
            why = WITHOUT_DDP.get(kind, "no DDP comm hook sees the gradients whole")
            warnings.warn(
                f"otb-diag: the all-parameter noise scale (otb/split/params/...) needs DDP; "
                f"this run is {kind} ({type(model).__name__}), so it is not logged: {why} "
                "(docs/live.md, 'Sharded policies').",
                RuntimeWarning,
                stacklevel=2,
            )
        return None
    args = trainer.args
    rows = args.per_device_train_batch_size * args.gradient_accumulation_steps
    group = model.process_group
    noise = DdpNoise(rows / trainer.num_generations, dist.get_world_size(group), group)
    model.register_comm_hook(group, noise.hook)  # before the first backward: train() is ahead
    return noise
