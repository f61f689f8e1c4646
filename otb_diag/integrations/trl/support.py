"""Which TRL trainers `attach` takes and what differs between them: the TRL versions tested,
the hooks it wraps, the registry estimator each trainer's settings make its advantages and the
loss aggregation, whether the trainer shards its parameters, whether it generates with one call
of transformers' `generate`, and whether TRL's fused head can give Σπ² (TRL 1.16,
`trl/trainer/grpo_trainer.py` and `rloo_trainer.py`)."""

from __future__ import annotations

import functools
import math
import types
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from otb_diag.errors import InputError
from otb_diag.maths.estimators.registry import trainer_baseline

TESTED = ("1.16",)  # TRL minor versions whose GRPOTrainer and RLOOTrainer the tests run
HOOKS = ("_generate_and_score_completions", "_calculate_rewards", "_compute_loss")
FUSED_OUTPUTS = ("log_probs", "entropy", "log_sum_sq_probs")
# GRPOTrainer's `scale_rewards` -> the `registry.trainer_baseline` name of the estimator its
# advantages are, `(R − mean_group R) / (std + 1e-4)` with the std of the group (`grpo`), none
# (`grpo-unscaled`) or of the batch (`grpo-batch`), each with TRL's ε and unbiased std
# (`maths/estimators/baselines.py`).
GRPO_SCALINGS = {"group": "trl", "none": "trl-none", "batch": "trl-batch"}
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


def grpo_estimator(trainer: Any) -> str | None:
    """The `registry.trainer_baseline` name of a GRPOTrainer's advantages, by its
    `scale_rewards` (`GRPO_SCALINGS`); None under `multi_objective_aggregation=
    "normalize_then_sum"`, which normalises each reward function within its groups before the
    sum: no baseline of the summed reward is that estimator."""
    if getattr(trainer, "multi_objective_aggregation", None) != "sum_then_normalize":
        return None
    return GRPO_SCALINGS.get(getattr(trainer, "scale_rewards", None))


def rloo_estimator(trainer: Any) -> str | None:
    """The `registry.trainer_baseline` name of an RLOOTrainer's advantages: `trl-rloo`,
    `R_i − mean_{j≠i} R_j` of the rewards it forms, its KL penalty `R − β·KL` included
    (`rows.py:local_rewards`); None when it normalises the advantages over the batch."""
    return None if getattr(trainer, "normalize_advantages", False) else "trl-rloo"


@dataclass(frozen=True)
class Supported:
    """A TRL trainer `attach` takes, and what differs between them."""

    estimator: Callable[[Any], str | None]  # its settings -> `registry.trainer_baseline` name
    settings: tuple[str, ...]  # the settings `estimator` reads
    aggregation: str | None  # how its loss averages per-token terms; None: by its `loss_type`
    kl_in_rewards: bool = False  # its `beta` shapes the rewards (RLOO), not the loss (GRPO)

    def audited(self, trainer: Any) -> tuple[str, dict[str, Any]] | None:
        """(registry name, options) of the estimator `trainer`'s advantages are under its
        settings; None when the registry has none for them."""
        name = self.estimator(trainer)
        return None if name is None else trainer_baseline(name)

    def describe(self, trainer: Any) -> str:
        """`trainer`'s values of the settings its estimator depends on, for a message."""
        return ", ".join(f"{name}={getattr(trainer, name, None)!r}" for name in self.settings)


# RLOOTrainer (TRL 1.16, `trl/trainer/rloo_trainer.py`): its loss is −min(ρ_i A_i, clip(ρ_i) A_i)
# averaged over sequences, ρ_i the ratio of the whole sequence (Σ_t log p), so its per-token
# terms are summed per sequence.
SUPPORTED = {
    "GRPOTrainer": Supported(
        grpo_estimator, ("scale_rewards", "multi_objective_aggregation"), None
    ),
    "RLOOTrainer": Supported(
        rloo_estimator, ("normalize_advantages",), "seq-mean-token-sum", kl_in_rewards=True
    ),
}


def check_split_tokens(trainer: Any, split_every: int) -> None:
    """The split weighs every completion token as the loss's aggregation does; GRPOTrainer's
    `top_entropy_quantile < 1` keeps only the high-entropy tokens in its loss, chosen inside its
    loss forward, which the split cannot see: an `InputError` for the split there."""
    quantile = getattr(trainer.args, "top_entropy_quantile", 1.0)
    if split_every and quantile < 1.0:
        raise InputError(
            f"the within/between split weighs every completion token, and top_entropy_quantile="
            f"{quantile:g} keeps only the highest-entropy tokens in the loss (chosen inside its "
            "forward): the split would be that of another gradient.",
            hint="attach(trainer, split_every=None) logs everything but the split (and the "
            "knee pooled from it).",
        )


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


def check_trainer(
    trainer: Any, supported: Supported, split_every: int, extra_forward: bool
) -> None:
    """What `attach` refuses of a TRL trainer whose hooks it can wrap: the split (`split_every`
    > 0) under a `loss_type` otb-diag does not know; on a trainer that shards its parameters,
    the split under FSDP1, and any extra forward (`extra_forward`: asked for, or a TRL without
    the fused head's Σπ²); and what it warns of: a trainer that already trained, a TRL version
    the tests do not run."""
    import trl

    if trainer.state.global_step > 0:
        warnings.warn(
            f"otb-diag: attach() after the trainer trained {trainer.state.global_step} steps: "
            "the diagnostics start with its next train(); attach before train() to measure "
            "from the first step.",
            stacklevel=3,
        )
    sharded = sharding(trainer)
    if split_every and sharded == FSDP1:
        raise InputError(
            "the within/between split gathers the output layer's weight for its scores, which "
            "otb-diag does under FSDP2 and DeepSpeed ZeRO-3; this trainer runs FSDP1, whose "
            "flat parameters it does not gather.",
            hint="Use FSDP2 (fsdp_config={'fsdp_version': 2}), or attach(trainer, "
            "split_every=None) for the other live diagnostics.",
        )
    if sharded is not None and extra_forward:
        raise InputError(
            f"under {sharded} every forward is a collective that all processes run together, "
            "and otb-diag's extra no-grad forward runs on each process's own rows (their "
            "number of forwards differs): it would hang the training. Asked for by "
            "extra_forward=True, or needed where TRL's fused head gives no log Σπ².",
            hint="attach(trainer) without extra_forward, with TRL 1.16 (its fused head "
            "gives log p and Σπ² from the loss's own forward).",
        )
    loss_type = getattr(trainer, "loss_type", None)
    if split_every and supported.aggregation is None and loss_type not in LOSS_AGGREGATION:
        raise InputError(
            f"the split needs the aggregation of TRL's loss_type {loss_type!r}, which otb-diag "
            f"does not know (it knows {', '.join(LOSS_AGGREGATION)}).",
            hint="attach(trainer, split_every=None) logs everything but the split.",
        )
    if ".".join(trl.__version__.split(".")[:2]) not in TESTED:
        warnings.warn(
            f"otb-diag live diagnostics are tested with TRL {', '.join(TESTED)}, not "
            f"{trl.__version__}; the hooks exist, the audit will say if the numbers agree.",
            stacklevel=3,
        )


FSDP1, FSDP2, ZERO3 = "FSDP1", "FSDP2", "DeepSpeed ZeRO-3"  # what `sharding` names


def sharding(trainer: Any) -> str | None:
    """`FSDP1`, `FSDP2` or `ZERO3` when `trainer` shards its parameters over the processes
    (read off its accelerator's plugins, set before `train()` wraps the model), else None."""
    if getattr(trainer, "is_fsdp_enabled", False):
        plugin = getattr(trainer.accelerator.state, "fsdp_plugin", None)
        return FSDP2 if getattr(plugin, "fsdp_version", 1) == 2 else FSDP1
    plugin = getattr(trainer.accelerator.state, "deepspeed_plugin", None)
    if plugin is not None and getattr(plugin, "zero_stage", None) == 3:
        return ZERO3
    return None


def generated_elsewhere(trainer: Any) -> str | None:
    """The setting by which `trainer` (TRL 1.16's `_generate_single_turn` and `_generate`) does
    not generate each process's batch with one call of transformers' `generate`, whose
    forwards `generation_stats.py` reads (vLLM, continuous batching, a rollout function, tool
    turns, beam search), for a message; None when it does."""
    config = getattr(trainer, "generation_config", None)
    settings = {
        "use_vllm=True": getattr(trainer, "use_vllm", False),
        "use_transformers_continuous_batching=True": getattr(
            trainer, "use_transformers_continuous_batching", False
        ),
        "a rollout_func": getattr(trainer, "rollout_func", None) is not None,
        "tools (each tool turn a generate call of its own)": bool(getattr(trainer, "tools", None)),
        f"num_beams={getattr(config, 'num_beams', 1)}": (getattr(config, "num_beams", 1) or 1) > 1,
    }
    return next((name for name, taken in settings.items() if taken), None)


def fused_head() -> Callable[..., None] | None:
    """TRL's `add_fused_lm_head` when it can compute `log_sum_sq_probs`, else None."""
    try:
        from trl.kernels.chunked_logprob import OPTIONAL_OUTPUTS
        from trl.trainer.utils import add_fused_lm_head
    except ImportError:
        return None
    return add_fused_lm_head if "log_sum_sq_probs" in OPTIONAL_OUTPUTS else None


def capture_fused(
    trainer: Any, model: Any, fused: Callable[..., None], capture: Callable[[Any], None]
) -> None:
    """Ask TRL's fused head of `model` for `FUSED_OUTPUTS` and hand every grad-enabled fused
    forward's output (the loss's) to `capture`."""
    fused(
        model,
        temperature=trainer.temperature,
        # RLOOConfig has no cast_lm_head_to_fp32: RLOOTrainer leaves the head as it is
        cast_lm_head_to_fp32=getattr(trainer.args, "cast_lm_head_to_fp32", False),
        outputs=FUSED_OUTPUTS,
    )
    forward = model.forward

    # `generate` checks its keyword arguments against the forward's signature: keep it.
    @functools.wraps(type(model).forward)
    def capturing(self: Any, *args: Any, **kwargs: Any) -> Any:
        output = forward(*args, **kwargs)
        if kwargs.get("fused_lm_head") and torch.is_grad_enabled():
            capture(output)
        return output

    model.forward = types.MethodType(capturing, model)


def log_to_trl(trainer: Any, metrics: Mapping[str, float]) -> None:
    """Append `metrics` to TRL's own metric lists (`trainer._metrics["train"]`, the one place
    otb-diag writes them), which TRL averages over the logging window and hands to every logger
    at its next log; a non-finite value (an undefined z or ratio) is left out, not logged as
    NaN."""
    logged = trainer._metrics["train"]
    for name, value in metrics.items():
        if math.isfinite(value):
            logged[name].append(value)
