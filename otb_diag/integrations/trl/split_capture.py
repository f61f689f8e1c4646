"""The split's head-mode scores from the loss's own forward, not from a second one.

Head mode (`policy/scores/token_scores.py`) needs, per response token, the final hidden state
`h_t` that the output layer reads and the softmax `π_t` of the logits it makes: the sketch is
`(P₁ (e_y − π_t)/τ) ⊗ (P₂ h̃_t)`. The trainer's loss forward runs the same backbone on the same
tokens with the same weights (before the optimizer step), so its hidden states are caught by a
forward hook on the backbone (`model.base_model`, the module TRL's fused LM head and Liger's
loss run), detached, during `_compute_loss` only. The π-side term `P₁ π_t` needs every logit:
TRL's fused head (`trl/kernels/chunked_logprob.py`) folds its `[4096, chunk]` tiles into
online-logsumexp sums and keeps none, and its optional outputs (entropy, `log Σπ²`, the mean
logit, top-1) carry no projection of π; so the logits are recomputed from the caught `h_t`,
`[256, V]` at a time under no_grad (`sketched_on_device`): one head matmul per response token,
`V · d` of the forward's `2 · params` flops per token, and no pass through the body.

The caught states are those the loss differentiates: TRL's left-padded rows without position
ids (docs/live.md, "TRL and left padding"), in train mode (dropout on where the model has it).
Where neither differs from a right-padded eval forward (prompts of equal length or rotary
positions, no dropout), the scores equal `token_scores`' from an extra forward to float32
round-off (tests/integrations/test_split_capture.py).

Sharded policies (DeepSpeed ZeRO-3, FSDP2). The hidden states are activations, whole on every
process; the output layer's weight `[V, d]` is a shard outside the forward. The scores of a
micro-step are formed while the weight is whole by its engine's own gather, for the duration of
the scoring only (`whole_output_layer`): ZeRO-3's `GatheredParameters` (an all-gather, read
only, partitioned again on leaving), FSDP2's `unshard` of the module that holds the layer (its
`reshard` after; between the loss forward and the backward FSDP2 keeps the root module's
parameters unsharded already, and then nothing is gathered). So no process holds a second full
copy of the weight for longer than the forward holds its own, no logit is computed twice, and
no process runs a forward the others do not. The gather is a collective: every process scores
at every micro-step of a split step (TRL gives each process the same number of micro-steps),
also a process whose own scoring has failed (its split is dropped at the step's gather, with
everyone's). Chosen over the row-sharded product (each process's `[N, V/W]` logits of every
process's tokens, their logsumexp and projections all-reduced): that needs every process's
hidden states on every process and three collectives a chunk, where the gather needs one a
micro-step and the unsharded arithmetic. The output layer is checked, once, against the loss
forward's own log p of the response tokens (TRL's fused head gives them; a plain loop its
log-softmax), not by `check_output_layer`'s probe: the probe's extra forward would release
ZeRO-3's gathered weight at the head's post-forward hook, and would be a forward of one
process's making."""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator
from typing import Any

import torch
from torch import Tensor, nn

from otb_diag.errors import InputError
from otb_diag.maths.noise.step_split import SPLIT_SEED
from otb_diag.policy.forward_pass import FP32_TOL, HALF_TOL, STATS_CHUNK, head_logits
from otb_diag.policy.scores.token_scores import HeadSketch, head_sketch_of, sketched_on_device


class HiddenCatch:
    """A forward hook on `model.base_model` that keeps its last hidden state `[b, L, d]`
    (detached) for every grad-enabled call inside `catching()`; outside, it does nothing. And
    the head-mode scores of what it caught (`scores`). `sharded`: the policy's parameters are
    sharded over the processes (module docstring): the output layer is gathered for the
    scoring and checked against the loss forward's log p, trained in half precision where
    `half`."""

    def __init__(self, model: nn.Module, *, sharded: bool = False, half: bool = False) -> None:
        self.model = model
        self.sharded = sharded
        self.half = half
        self._caught: list[Tensor] | None = None
        self._checked = False  # the output layer checked against the model's logits, once
        model.base_model.register_forward_hook(self._hook)

    def _hook(self, module: nn.Module, args: Any, output: Any) -> None:
        if self._caught is not None and torch.is_grad_enabled():  # the loss's forward only
            self._caught.append(output[0].detach())  # last_hidden_state

    @contextlib.contextmanager
    def catching(self, active: bool) -> Iterator[list[Tensor]]:
        """Yields the list the loss forward's hidden states are appended to (left empty when
        not `active`)."""
        caught: list[Tensor] = []
        self._caught = caught if active else None
        try:
            yield caught
        finally:
            self._caught = None

    def scores(
        self,
        caught: list[Tensor],
        completion_ids: Tensor,
        temperature: float,
        k: int,
        logprobs: Tensor | None = None,
        mask: Tensor | None = None,
    ) -> Tensor:
        """`[m, C, k]` the split's head-mode scores (`step_metrics.split_scores`' seed and mode)
        of the `m` rows whose loss forward was caught, at every completion position.

        caught: the backbone's hidden states `[b_i, L, d]` of `prompt ⧺ completion` rows, in
        row order (TRL scores a micro-batch in chunks, `_get_per_token_logps_and_entropies`);
        completion_ids `[m, C]`: position `L − C + j` holds completion token j, predicted by the
        hidden state at `L − C + j − 1`. Padding positions get scores too; the caller zeroes
        them. The output layer is checked on the first call only: unsharded against the
        model's logits (its two probe forwards cost more than the sketch itself); sharded
        against `logprobs` `[m, C]`, the loss forward's log p of the completion tokens at
        `temperature`, where `mask` `[m, C]` is 1 (an `InputError` without them). Sharded, a
        collective: every process calls it at the same micro-steps."""
        hidden = torch.cat(caught)  # [m, L, d]
        m, c = completion_ids.shape
        h = hidden[:, -c - 1 : -1].reshape(m * c, -1)  # [m·C, d]
        targets = completion_ids.reshape(-1).to(h.device)
        tau = torch.full((m * c,), float(temperature), device=h.device)
        with whole_output_layer(self.model):
            check = not self._checked and not self.sharded
            sketch = head_sketch_of(self.model, k, SPLIT_SEED, check=check)
            if self.sharded and not self._checked:
                if logprobs is None or mask is None:
                    raise InputError(
                        "the split of a sharded policy checks its output layer against the "
                        "loss forward's log p, and this forward gave none."
                    )
                self._check_against(sketch, h, targets, tau, logprobs, mask)
            self._checked = True
            proj, _ = sketched_on_device(sketch, h, targets, tau, STATS_CHUNK)  # on the device
        return proj.view(m, c, k)

    def _check_against(
        self,
        sketch: HeadSketch,
        h: Tensor,
        targets: Tensor,
        tau: Tensor,
        logprobs: Tensor,
        mask: Tensor,
    ) -> None:
        """An `InputError` unless `log softmax(z/τ)_y` from the caught `h [N, d]` and `sketch`'s
        layer equals the loss forward's `logprobs` (`[m, C]`, N = m·C) where `mask` is 1:
        what `check_output_layer` checks, read off the forward that trained."""
        with torch.no_grad():
            z = head_logits(h, sketch.weight, sketch.bias, sketch.softcap, sketch.scale)
            scaled = z / tau[:, None]  # [N, V]
            rebuilt = scaled.log_softmax(-1).gather(-1, targets[:, None])[:, 0]  # [N]
            on = mask.reshape(-1).to(h.device).bool()
            loss = logprobs.reshape(-1).to(h.device, torch.float32)
            err = float((rebuilt - loss)[on].abs().max()) if on.any() else 0.0
            fp32 = not self.half and h.dtype == sketch.weight.dtype == torch.float32
            tol = (FP32_TOL if fp32 else HALF_TOL) * (1.0 + float(scaled.abs().max()))
        if err > tol:
            raise InputError(
                f"{type(self.model).__name__}: the log p rebuilt from the loss forward's "
                f"hidden states and the output layer differ from the loss's own by {err:.3g} "
                f"(tolerance {tol:.3g}); its head applies a transform otb-diag does not support."
            )


@contextlib.contextmanager
def whole_output_layer(model: nn.Module) -> Iterator[None]:
    """`model`'s output layer whole on this process inside, by its engine's own gather, and
    sharded as before once left (module docstring): DeepSpeed ZeRO-3's `GatheredParameters`
    (read only: nothing is written back) for its partitioned parameters, FSDP2's `unshard` and
    `reshard` of the `fully_shard`ed module that holds a sharded (DTensor) one; nothing where
    the layer is whole already (no sharding, ZeRO-3's persistent parameters, FSDP2's root
    between forward and backward). Every process takes the same branch (the engine's state is
    the same on all), so the collectives match."""
    head = model.get_output_embeddings()
    params = [
        p for p in (getattr(head, "weight", None), getattr(head, "bias", None)) if p is not None
    ]
    partitioned = [p for p in params if getattr(p, "ds_status", None) is not None]
    if partitioned:
        import deepspeed
        from deepspeed.runtime.zero.partition_parameters import ZeroParamStatus

        # Already gathered (persistent, or a tied embedding's) stays as it is: partitioning
        # it on leaving would pull it from under the module that holds it (as TRL's own
        # `maybe_gather_lm_head_ctx` leaves it).
        away = [p for p in partitioned if p.ds_status != ZeroParamStatus.AVAILABLE]
        with deepspeed.zero.GatheredParameters(away, modifier_rank=None, enabled=bool(away)):
            yield
        return
    if any(_is_dtensor(p) for p in params):
        owner = _fsdp_owner(model, head)
        owner.unshard()
        try:
            yield
        finally:
            owner.reshard()
        return
    yield


def _is_dtensor(t: Tensor) -> bool:
    try:  # torch >= 2.4; FSDP2 needs it
        from torch.distributed.tensor import DTensor
    except ImportError:
        return False
    return isinstance(t, DTensor)


def _fsdp_owner(model: nn.Module, head: nn.Module) -> Any:
    """The `fully_shard`ed module whose parameter group holds `head`'s parameters: the deepest
    FSDP2 module above (or at) `head`; an `InputError` where none is (a DTensor of another
    kind of parallelism, which otb-diag does not gather)."""
    from torch.distributed.fsdp import FSDPModule

    # `modules()` walks depth first, parents before children: the last one holding `head` is
    # the deepest.
    owners = [
        m
        for m in model.modules()
        if isinstance(m, FSDPModule) and any(s is head for s in m.modules())
    ]
    if not owners:
        raise InputError(
            f"{type(model).__name__}'s output layer is a DTensor outside FSDP2's fully_shard "
            "(tensor parallelism?); otb-diag gathers it only under FSDP2 and DeepSpeed ZeRO-3."
        )
    return owners[-1]


def split_dropped(step: int, what: str) -> None:
    """Say once that the split's scores failed at `step` (its check of the output layer, its
    extra forward) and that the split alone stops: a failure of the split once switched every
    live metric off."""
    warnings.warn(
        f"otb-diag: the within/between split switched off at step {step}: {what}. The "
        "other live diagnostics go on; attach(trainer, split_every=None) leaves the split "
        "out from the start.",
        RuntimeWarning,
        stacklevel=5,
    )
