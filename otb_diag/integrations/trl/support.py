"""Which TRL trainers `attach` takes and what differs between them: the TRL versions tested,
the hooks it wraps, the estimator and loss aggregation each trainer documents, whether the
trainer shards its parameters, and whether TRL's fused head can give Σπ² (TRL 1.16,
`trl/trainer/grpo_trainer.py` and `rloo_trainer.py`)."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from otb_diag.errors import InputError

TESTED = ("1.16",)  # TRL minor versions whose GRPOTrainer and RLOOTrainer the tests run
HOOKS = ("_generate_and_score_completions", "_calculate_rewards", "_compute_loss")
FUSED_OUTPUTS = ("log_probs", "entropy", "log_sum_sq_probs")
# TRL's documented estimator (registry: `grpo` with ε = 1e-4) holds under these settings only.
TRL_DEFAULTS = {"scale_rewards": "group", "multi_objective_aggregation": "sum_then_normalize"}
# TRL's `loss_type` -> how its loss averages per-token terms (`maths/aggregation.py`), read off
# `GRPOTrainer._compute_loss`: grpo and sapo average each sequence's tokens, then the
# sequences; bnpo, dapo, cispo, vespo divide by the tokens of the batch; dr_grpo by B times a
# constant length (the padded width here: the split's ratios do not see the constant); luspo
# sums each sequence's tokens and averages the sequences.
LOSS_AGGREGATION = {
    "grpo": "seq-mean-token-mean",
    "sapo": "seq-mean-token-mean",
    "bnpo": "token-mean",
    "dapo": "token-mean",
    "cispo": "token-mean",
    "vespo": "token-mean",
    "dr_grpo": "seq-mean-token-sum-norm",
    "luspo": "seq-mean-token-sum",
}


@dataclass(frozen=True)
class Supported:
    """A TRL trainer `attach` takes, and what differs between them."""

    registry: str  # `registry.trainer_baseline` name of the estimator its documentation gives
    documented: Mapping[str, Any]  # the settings under which its advantages are that estimator
    aggregation: str | None  # how its loss averages per-token terms; None: by its `loss_type`


# RLOOTrainer (TRL 1.16, `trl/trainer/rloo_trainer.py`): A_i = R_i − mean_{j≠i} R_j (the
# registry's `rloo`), unless its KL penalty (`beta`) shapes the rewards or it normalises the
# advantages; its loss is −min(ρ_i A_i, clip(ρ_i) A_i) averaged over sequences, ρ_i the ratio of
# the whole sequence (Σ_t log p), so its per-token terms are summed per sequence.
SUPPORTED = {
    "GRPOTrainer": Supported("trl", TRL_DEFAULTS, None),
    "RLOOTrainer": Supported(
        "trl-rloo", {"beta": 0.0, "normalize_advantages": False}, "seq-mean-token-sum"
    ),
}


def supported_trainer(trainer: Any) -> Supported:
    """What `attach` knows of `trainer`'s class; an `InputError` for one it cannot hook."""
    import trl

    kinds = [name for name in SUPPORTED if getattr(trl, name, None) is not None]
    name = next((k for k in kinds if isinstance(trainer, getattr(trl, k))), None)
    if name is None:
        raise InputError(
            f"attach() takes a trl.{' or trl.'.join(kinds)}; got a {type(trainer).__name__}.",
            hint="Construct the trainer first, then call attach(trainer) before train().",
        )
    missing = [h for h in HOOKS if not callable(getattr(trainer, h, None))]
    if missing:
        raise InputError(
            f"TRL {trl.__version__}'s {name} has no {', '.join(missing)}, the hook(s) "
            f"attach() uses; it is tested with TRL {', '.join(TESTED)}.",
            hint="Install a tested TRL (pip install 'trl==1.16.*'), or dump the batches "
            "yourself and run otb-diag energy on them.",
        )
    return SUPPORTED[name]


def sharding(trainer: Any) -> str | None:
    """ "FSDP" or "DeepSpeed ZeRO-3" when `trainer` shards its parameters over the processes
    (read off its accelerator's plugins, set before `train()` wraps the model), else None."""
    if getattr(trainer, "is_fsdp_enabled", False):
        return "FSDP"
    plugin = getattr(trainer.accelerator.state, "deepspeed_plugin", None)
    if plugin is not None and getattr(plugin, "zero_stage", None) == 3:
        return "DeepSpeed ZeRO-3"
    return None


def fused_head() -> Callable[..., None] | None:
    """TRL's `add_fused_lm_head` when it can compute `log_sum_sq_probs`, else None."""
    try:
        from trl.kernels.chunked_logprob import OPTIONAL_OUTPUTS
        from trl.trainer.utils import add_fused_lm_head
    except ImportError:
        return None
    return add_fused_lm_head if "log_sum_sq_probs" in OPTIONAL_OUTPUTS else None


def log_to_trl(trainer: Any, metrics: Mapping[str, float]) -> None:
    """Append `metrics` to TRL's own metric lists (`trainer._metrics["train"]`, the one place
    otb-diag writes them), which TRL averages over the logging window and hands to every logger
    at its next log; a non-finite value (an undefined z or ratio) is left out, not logged as
    NaN."""
    logged = trainer._metrics["train"]
    for name, value in metrics.items():
        if math.isfinite(value):
            logged[name].append(value)
