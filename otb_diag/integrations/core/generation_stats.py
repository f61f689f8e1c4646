"""log p and Σπ² of the sampling policy, caught while the trainer generates with transformers.

OTB's advantages need each token's realized energy `w_t = (1 − 2 p_t + Σπ²_t)/τ²` before the
loss's forward runs (the advantages are its input). The policy computed exactly these logits
when it sampled the batch: `model.generate` runs one forward a new token, whose last-position
logits `z_t` `[B, V]` give the tempered distribution `π_t = softmax(z_t / τ)` the token was
drawn from (TRL passes `temperature` to `generate`). A forward hook on the model, active only
inside `generate`, keeps per step

    Σπ²_t = Σ_v π_t(v)² = Σ_v exp(2 log π_t(v))          `[B]`
    log p_t = log π_t(y_t)                                 `[B]`, y_t read at the next step

(y_t is the next forward's input; the last one from `generate`'s output), in fp32 whatever
autocast the forward ran under. Under `synced_gpus` (transformers' default for a model sharded
by FSDP or DeepSpeed ZeRO-3 over several processes) a process whose rows have all ended goes on
running forwards, appending no token, until every process's have: those steps lie past its
tokens and are cut off (the first of them still reads the last token's log p, its input being
that token). That is `O(B · V)` a token beside the forward's `O(params)`:
the extra no-grad forward it replaces cost 15–40 % of a step (issue 40).

The processed scores a logits processor would see come after `generate`'s warpers (top-k,
top-p, repetition penalty), which truncate the distribution; the hook reads the model's own
logits, so `π_t` is the full tempered softmax the trainer's loss scores, as the extra forward
computed it. It runs in the mode `generate` runs in (TRL's: the model's training mode; dropout
where the model has it is the sampler's own).
"""

from __future__ import annotations

import functools
from typing import Any

import torch
from torch import Tensor, nn

from otb_diag.policy.causal_lm import causal_lm
from otb_diag.policy.forward_pass import no_autocast


class GenerationStats:
    """Installed on `model` (a transformers causal LM, or a PEFT wrapper of one): wraps its
    `generate` and hooks the forward of its causal LM (`policy/causal_lm.py:causal_lm`: a
    wrapper's `generate` hands the decoding to the causal LM inside it, whose forwards run).
    After each `generate` call, `taken()` gives `(log p [B, C], Σπ² [B, C])` of the C tokens it
    generated for its B rows, at temperature `temperature`; None when the call could not be
    read (no `logits` in the output, beam search, several tokens a decoding step)."""

    def __init__(self, model: nn.Module, temperature: float) -> None:
        self.tau = float(temperature)
        self._steps: list[tuple[Tensor, Tensor | None]] | None = None  # (Σπ², log p of y_{t−1})
        self._prompt_width = 0  # the first forward's input: the tokens before the generated ones
        self._last: Tensor | None = None  # [B, V] log π of the latest step
        self._taken: tuple[Tensor, Tensor] | None = None
        causal_lm(model).register_forward_hook(self._hook, with_kwargs=True)
        generate = model.generate

        @functools.wraps(generate)
        def generating(*args: Any, **kwargs: Any) -> Any:
            config = kwargs.get("generation_config") or getattr(model, "generation_config", None)
            beams = kwargs.get("num_beams") or getattr(config, "num_beams", 1) or 1
            # Beam search reorders the rows at every step: its rows' statistics are not read.
            self._steps, self._last, self._taken = [] if beams == 1 else None, None, None
            try:
                output = generate(*args, **kwargs)
                try:
                    self._taken = self._finish(output)
                except Exception:  # noqa: BLE001  never the trainer's generation: no stats
                    self._taken = None
                return output
            finally:
                self._steps, self._last = None, None

        model.generate = generating

    def _hook(self, _module: nn.Module, _args: Any, kwargs: dict[str, Any], output: Any) -> None:
        if self._steps is None or torch.is_grad_enabled():
            return
        logits = getattr(output, "logits", None)
        ids = kwargs.get("input_ids")
        if logits is None or ids is None or (self._steps and ids.shape[1] != 1):
            # A forward this hook cannot read, or a decoding step of several tokens at once
            # (assisted or speculative decoding): no stats for this call.
            self._steps = None
            return
        with no_autocast(logits.device):
            log_pi = torch.log_softmax(logits[:, -1].float() / self.tau, dim=-1)  # [B, V]
        if not self._steps:
            self._prompt_width = ids.shape[1]
        previous = None
        if self._last is not None:  # y_{t−1} is this forward's last input token
            previous = self._last.gather(1, ids[:, -1:])[:, 0]
        self._steps.append((torch.exp(2 * log_pi).sum(-1), previous))
        self._last = log_pi

    def _finish(self, output: Any) -> tuple[Tensor, Tensor] | None:
        """`(log p, Σπ²)` `[B, C]` on the CPU, C the tokens generated (the steps run, less a
        synced process's steps past its tokens); the last token's log p from the next step's
        input, or without one from the returned sequences."""
        sequences = output if isinstance(output, Tensor) else getattr(output, "sequences", None)
        if not self._steps or self._last is None or sequences is None:
            return None
        generated = sequences.shape[1] - self._prompt_width
        last = self._last.gather(1, sequences[:, -1:].to(self._last.device))[:, 0]
        logps = torch.stack([lp for _, lp in self._steps[1:]] + [last], 1)[:, :generated]
        sum_pi2 = torch.stack([s for s, _ in self._steps], 1)[:, :generated]
        return logps.cpu(), sum_pi2.cpu()

    def taken(self) -> tuple[Tensor, Tensor] | None:
        """The last `generate` call's `(log p, Σπ²)` `[B, C]`, once; None when there is none."""
        taken, self._taken = self._taken, None
        return taken
