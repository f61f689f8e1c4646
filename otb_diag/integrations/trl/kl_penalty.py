"""RLOOTrainer's KL penalty on its rewards, so that its advantages are a registry estimator of
the rewards they were formed from.

TRL 1.16's `RLOOTrainer` (`trl/trainer/rloo_trainer.py`, `_generate_and_score_completions`)
shapes each completion's reward before its leave-one-out baseline (following Ahmadian et al.,
2024):

    R'_i = R_i − β · KL_i,    KL_i = Σ_t (log π_old(y_t) − log π_ref(y_t)) · m_t

with the first-order log ratio per token (not GRPO's k3 estimate, which GRPO puts in its loss,
not its rewards), so its advantages are `rloo` of R' (`A_i = R'_i − mean_{j≠i} R'_j`). Neither
log-probability reaches the batch it returns (only `old_logps`, their sum for the policy): it
computes both in its generation, one `_get_per_token_logps_and_entropies` call for the policy,
then one for the reference (the reference model, or the policy with its PEFT adapter off), and
keeps neither. `KlPenalty` catches what those two calls return, during the generation only,
and forms `β · KL_i` with TRL's own operations on TRL's own tensors, so R' is TRL's to the bit
(`rows.py:local_rewards` subtracts it): no forward beyond TRL's.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from torch import Tensor

LOGPS = "_get_per_token_logps_and_entropies"  # the RLOOTrainer method both forwards run


class KlPenalty:
    """Installed on an RLOOTrainer with `beta ≠ 0`: catches the per-token log-probabilities its
    generation computes (`generating`) and gives each completion's `β · KL_i` (`penalty`)."""

    def __init__(self, trainer: Any) -> None:
        self.beta = float(trainer.beta)
        self._caught: list[Tensor] | None = None  # inside `generating`
        self._last: list[Tensor] = []  # what the latest generation's forwards returned
        logps = getattr(trainer, LOGPS)

        def catching(*args: Any, **kwargs: Any) -> Any:
            out = logps(*args, **kwargs)
            if self._caught is not None:
                self._caught.append(out[0].detach())  # per-token log p `[n, C]`
            return out

        setattr(trainer, LOGPS, catching)

    @contextlib.contextmanager
    def generating(self) -> Iterator[None]:
        """Catch the log-probabilities of the generation run inside (the last caught are kept
        until the next generation)."""
        self._caught = []
        try:
            yield
        finally:
            self._last, self._caught = self._caught or [], None

    def penalty(self, completion_mask: Tensor) -> Tensor:
        """`β · KL_i` `[n]` of the latest generation's n completions (`completion_mask [n, C]`
        as it returned it), in TRL's operations: `(old − ref) · m` summed over the tokens, times
        β. An error when that generation did not run the two forwards TRL's code runs."""
        if len(self._last) != 2:
            raise RuntimeError(
                f"RLOOTrainer's generation ran {len(self._last)} log-probability forward(s), "
                "not the policy's and the reference's: the KL penalty of its rewards is unknown"
            )
        old, ref = self._last
        per_token_kl = old - ref
        return self.beta * (per_token_kl * completion_mask).sum(-1)
