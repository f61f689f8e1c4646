"""How per-token terms are averaged into one estimate (docs/theory.md §3, "Aggregation Z").

Each mode is one function `mask: [B, T] -> c: [B, T]` registered under verl's `agg_loss` names,
so that for any per-token matrix `x` the aggregate is `sum_{i,t} c_{i,t} x_{i,t}` and the
gradient estimate is `g = sum_i sum_t c_{i,t} A_{i,t} s_{i,t}`. `c` is 0 wherever mask is 0.

Conventions follow verl's `agg_loss` (`verl/trainer/ppo/core_algos.py`) on one process
(`dp_size = 1`, no global token or sequence counts): the seq-mean modes divide by the number of
sequences with at least one generated token, and seq-mean-token-mean adds 1e-8 to each length.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from otb_diag.errors import InputError

AggregationFn = Callable[[Tensor], Tensor]

AGGREGATIONS: dict[str, AggregationFn] = {}
_DEFAULTS: list[str] = []  # the first name of each mode measured by default


def register_aggregation(
    *names: str, default: bool = False
) -> Callable[[AggregationFn], AggregationFn]:
    """Decorator adding `fn` to `AGGREGATIONS` under each of `names` (aliases share one fn);
    `default` puts its first name among the modes `variance-compare` measures by default."""

    def decorator(fn: AggregationFn) -> AggregationFn:
        for name in names:
            if name in AGGREGATIONS:
                raise ValueError(f"aggregation '{name}' is already registered")
            AGGREGATIONS[name] = fn
        if default:
            _DEFAULTS.append(names[0])
        return fn

    return decorator


def default_aggregations() -> tuple[str, ...]:
    """The modes measured by default, in registration order."""
    return tuple(_DEFAULTS)


def _num_sequences(mask: Tensor) -> Tensor:
    """Sequences with at least one generated token (verl leaves empty ones out of seq-means)."""
    return (mask.sum(-1) > 0).sum().clamp_min(1)


@register_aggregation("token-sum", "seq-mean-token-sum", default=True)
def seq_mean_token_sum(mask: Tensor) -> Tensor:
    """Sum over tokens, mean over sequences (the REINFORCE form of the theory): `c = 1/B`."""
    return mask / _num_sequences(mask)


@register_aggregation("seq-mean-token-mean", default=True)
def seq_mean_token_mean(mask: Tensor) -> Tensor:
    """GRPO: mean over each sequence's tokens, then over sequences: `c = 1/(B |y_i|)`."""
    lengths = mask.sum(-1, keepdim=True)
    return mask / (lengths + 1e-8) / _num_sequences(mask)


@register_aggregation("token-mean", default=True)
def token_mean(mask: Tensor) -> Tensor:
    """DAPO: mean over every generated token of the batch: `c = 1 / sum mask`."""
    return mask / mask.sum().clamp_min(1)


@register_aggregation("seq-mean-token-sum-norm")
def seq_mean_token_sum_norm(mask: Tensor) -> Tensor:
    """Dr.GRPO: sum over every token divided by the padded length T: `c = 1/T`."""
    return mask / mask.shape[-1]


def check_aggregation(name: str) -> None:
    """An `InputError` listing the registered aggregations when `name` is none of them."""
    if name not in AGGREGATIONS:
        raise InputError(
            f"unknown aggregation '{name}'; known aggregations: {', '.join(sorted(AGGREGATIONS))}",
            field="aggregation",
        )


def aggregation_weights(name: str, mask: Tensor) -> Tensor:
    """Coefficients `c: [B, T]` of mode `name` for `mask: [B, T]` (float)."""
    check_aggregation(name)
    return AGGREGATIONS[name](mask.float() if not mask.is_floating_point() else mask)


def aggregate(name: str, values: Tensor, mask: Tensor) -> Tensor:
    """Scalar `sum_{i,t} c_{i,t} values_{i,t}` for `values, mask: [B, T]` (verl's `agg_loss`).

    Entries outside the mask never count, even when they are NaN or inf.
    """
    weights = aggregation_weights(name, mask)
    return torch.where(mask.bool(), weights * values, 0.0).sum()
