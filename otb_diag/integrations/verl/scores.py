"""The within/between split's score vectors formed on verl's actor workers, where verl forms
`sum_pi_squared`: from the tensors of the actor's log-prob forward, so the driver gets the split
from `compute_otb_metrics(batch)` with no model on its process (docs/live.md, "The split on
verl's workers").

The actor's forward already holds the two things head mode needs (`policy/scores/
token_scores.py`, module docstring): the output layer's input `h` (caught by a forward hook on
the model's output embedding) and its output, the logits `z`.
`forward_scores` turns them into the projected scores `[..., k]` through
`token_scores.py:head_sketch`, the very function `step_metrics.py:split_scores` runs on its own
forward, with the same seeded projection (`step_split.SPLIT_SEED`) at every step and on every
worker: k = 64 floats per token beside verl's `log_probs`, against V for the logits.
The driver carries them to the advantage step under `OTB_SCORES` (`[B, T, k]`, aligned with
`responses`, 0 on padding), where `compute_otb_metrics` reads them.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from otb_diag.maths.noise.step_split import SPLIT_K, SPLIT_SEED
from otb_diag.policy.forward_pass import STATS_CHUNK, output_layer
from otb_diag.policy.scores.token_scores import head_sketch, head_sketch_matrices

OTB_SCORES = "otb_scores"  # the batch key of the worker-formed scores, `[B, T, k]`


def forward_scores(
    model: nn.Module,
    hidden: Tensor,
    logits: Tensor,
    targets: Tensor,
    temperature: Tensor | float,
    k: int = SPLIT_K,
) -> Tensor:
    """`[..., k]` fp32 head-mode scores of `targets` from one forward's tensors.

    hidden: `[..., d]` the output layer's input at the positions that predict `targets` (what
    a forward hook on the output embedding receives); logits: `[..., V]` the model's logits
    there, before the temperature; targets: `[...]` the sampled tokens; temperature: the
    rollout's τ (a scalar or `[...]`).
    The same numbers as `token_scores(model, batch, "head", k, SPLIT_SEED).proj` on those
    tokens, whichever worker computes them: V and d are read off the tensors, not the head's
    weight, which FSDP shards."""
    _, bias, scale, softcap = output_layer(model)
    biased = bias is not None
    p1, p2 = head_sketch_matrices(logits.shape[-1], hidden.shape[-1] + biased, k, SPLIT_SEED)
    sketch = (p1.to(logits.device), p2.to(logits.device))
    lead = targets.shape
    h = hidden.detach().reshape(-1, hidden.shape[-1])  # [N, d]
    z = logits.detach().reshape(-1, logits.shape[-1])  # [N, V]
    y = targets.reshape(-1)
    tau = torch.as_tensor(temperature, dtype=torch.float32, device=z.device).expand(lead)
    tau = tau.reshape(-1)
    proj = torch.zeros(len(y), k, device=z.device)
    with torch.no_grad():
        for lo in range(0, len(y), STATS_CHUNK):  # [chunk, V] of u at a time, beside the logits
            c = slice(lo, lo + STATS_CHUNK)
            # the head reads s · h
            proj[c] = head_sketch(h[c].float() * scale, z[c], y[c], tau[c], sketch, biased,
                                  softcap)[0]  # fmt: skip
    return proj.reshape(*lead, k)


class OTBScores:
    """Mixed in before verl's `FSDPEngineWithLMHead` (verl 0.9.1,
    `verl/workers/engine/fsdp/transformer_impl.py`; `with_otb_scores` makes the class): on every
    forward that computes `sum_pi_squared` (the actor's log-prob forward with
    `calculate_sum_pi_squared`), it adds `model_output["otb_scores"]`, `forward_scores` of every
    token, nested like `log_probs` (`[B, L_i, k]`, the scores of the token that follows each
    position), which the worker returns beside them and the driver cuts to the responses as it
    cuts `log_probs` (docs/live.md). Both of verl's layouts: remove-padding (packed `[1, nnz]`,
    Ulysses sequence parallel included) and padded."""

    _otb_hook: Any = None
    _otb_hidden: Tensor | None = None

    def prepare_model_inputs(self, micro_batch: Any) -> Any:
        if self._otb_hook is None:  # once: the head's input of the forward that follows
            head = self.module.get_output_embeddings()
            self._otb_hook = head.register_forward_hook(self._otb_catch)
        return super().prepare_model_inputs(micro_batch)  # type: ignore[misc]

    def _otb_catch(self, _module: nn.Module, args: tuple[Tensor, ...], _out: Tensor) -> None:
        self._otb_hidden = args[0].detach()

    def prepare_model_outputs(
        self, output: Any, output_args: dict, micro_batch: Any, logits_processor_func: Any
    ) -> dict:
        from verl.utils import tensordict_utils as tu

        wanted = tu.get_non_tensor_data(micro_batch, key="calculate_sum_pi_squared", default=False)
        # before verl divides the logits by τ (in place)
        scores = self._otb_scores(output, output_args, micro_batch) if wanted else None
        out = super().prepare_model_outputs(  # type: ignore[misc]
            output, output_args, micro_batch, logits_processor_func
        )
        if scores is not None:
            out[OTB_SCORES] = scores
        return out

    def _otb_scores(self, output: Any, output_args: dict, micro_batch: Any) -> Tensor:
        """Nested `[B, L_i, k]`: the packed rows' scores, as verl packs `log_probs`."""
        from verl.utils import tensordict_utils as tu

        logits, hidden = output.logits, self._otb_hidden
        if hasattr(logits, "full_tensor"):  # a DTensor under tensor parallelism
            logits = logits.full_tensor()
        offsets = micro_batch["input_ids"].offsets()
        targets = output_args["input_ids_rmpad_rolled"]  # the token each position predicts
        if tu.get_non_tensor_data(micro_batch, key="use_remove_padding", default=True):
            tau = output_args["temperature_rmpad"]
            packed = forward_scores(self.module, hidden[0], logits[0], targets, tau)
            packed = self._gather_and_unpad_packed(packed, output_args["pad_size"])
        else:  # [B, L, ·] padded on the right: keep each row's first L_i positions
            lengths = offsets.diff()
            keep = torch.arange(logits.shape[1], device=logits.device) < lengths[:, None]
            tau = output_args["temperature"][:, None].expand_as(keep)[keep]
            packed = forward_scores(self.module, hidden[keep], logits[keep], targets, tau)
        return torch.nested.nested_tensor_from_jagged(packed, offsets)


def with_otb_scores(engine_cls: type) -> type:
    """`engine_cls` (verl's `FSDPEngineWithLMHead` or a subclass) with `OTBScores` mixed in."""
    return type(f"OTBScores{engine_cls.__name__}", (OTBScores, engine_cls), {})


def enable_otb_scores(backends: tuple[str, ...] = ("fsdp", "fsdp2")) -> None:
    """The one place a verl user enables the split's scores on the workers: verl's engine
    registry then builds every language-model engine of `backends` with `OTBScores` mixed in.
    Call it in each worker process before the engines are built (docs/live.md)."""
    from verl.workers.engine.base import EngineRegistry

    for backend in backends:
        registry = EngineRegistry._engines["language_model"][backend]
        for key, cls in registry.items():
            if not issubclass(cls, OTBScores):
                registry[key] = with_otb_scores(cls)
