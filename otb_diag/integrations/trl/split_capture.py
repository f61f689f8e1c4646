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
round-off (tests/integrations/test_split_capture.py)."""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator
from typing import Any

import torch
from torch import Tensor, nn

from otb_diag.maths.noise.step_split import SPLIT_SEED
from otb_diag.policy.forward_pass import STATS_CHUNK
from otb_diag.policy.scores.token_scores import head_sketch_of, sketched_on_device


class HiddenCatch:
    """A forward hook on `model.base_model` that keeps its last hidden state `[b, L, d]`
    (detached) for every grad-enabled call inside `catching()`; outside, it does nothing. And
    the head-mode scores of what it caught (`scores`)."""

    def __init__(self, model: nn.Module) -> None:
        self.model = model
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
        self, caught: list[Tensor], completion_ids: Tensor, temperature: float, k: int
    ) -> Tensor:
        """`[m, C, k]` the split's head-mode scores (`step_metrics.split_scores`' seed and mode)
        of the `m` rows whose loss forward was caught, at every completion position.

        caught: the backbone's hidden states `[b_i, L, d]` of `prompt ⧺ completion` rows, in
        row order (TRL scores a micro-batch in chunks, `_get_per_token_logps_and_entropies`);
        completion_ids `[m, C]`: position `L − C + j` holds completion token j, predicted by the
        hidden state at `L − C + j − 1`. Padding positions get scores too; the caller zeroes
        them. The output layer is checked against the model's logits on the first call only
        (its two probe forwards cost more than the sketch itself)."""
        sketch = head_sketch_of(self.model, k, SPLIT_SEED, check=not self._checked)
        self._checked = True
        hidden = torch.cat(caught)  # [m, L, d]
        m, c = completion_ids.shape
        h = hidden[:, -c - 1 : -1].reshape(m * c, -1)  # [m·C, d]
        targets = completion_ids.reshape(-1).to(h.device)
        tau = torch.full((m * c,), float(temperature), device=h.device)
        proj, _ = sketched_on_device(sketch, h, targets, tau, STATS_CHUNK)  # on the device
        return proj.view(m, c, k)


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
