"""The noise scale of all parameters from two batch sizes of one step (McCandlish et al. 2018,
"An Empirical Model of Large-Batch Training", appendix A): under data parallelism each process's
local gradient and their all-reduced mean are gradient estimates of the same step at two batch
sizes, so their squared norms give `|G|²` and `tr Σ` at no extra backward pass.

The unit of a batch is the prompt, as in the split's `P` (`step_split.py`): a step of `B`
prompts estimates `G` by `g = (1/B) Σ_p ĝ_p`, the `ĝ_p` (one per prompt, from its N responses)
independent with mean `G` and covariance `Σ` (`tr Σ` is the split's `total`, in parameter space).
Then `E|g|² = |G|² + tr Σ / B`. With `W` processes of `B_small` prompts each, `g_i` their local
gradients and `g_big = (1/W) Σ_i g_i` (DDP's all-reduced mean, over `B_big = W B_small`
prompts), and `|g_small|² = (1/W) Σ_i |g_i|²`:

    E|g_small|² = |G|² + tr Σ / B_small,      E|g_big|² = |G|² + tr Σ / B_big,

two linear equations in `|G|²` and `tr Σ` whose solution,

    |G|²  ≈ (B_big |g_big|² − B_small |g_small|²) / (B_big − B_small)
    tr Σ  ≈ (|g_small|² − |g_big|²) / (1/B_small − 1/B_big),

is linear in the two measured squares, so each estimate is unbiased (expectation of a linear
map = the map of the expectations, which solve the equations exactly). Each is noisy on its own
(either can come out negative); like the split, read them pooled over many steps, the ratio
`tr Σ / |G|²` taken of the pooled means (McCandlish's B_simple).
"""

from __future__ import annotations

from typing import NamedTuple

from torch import Tensor

from otb_diag.errors import InputError


class TwoBatch(NamedTuple):
    """One step's unbiased estimates: `grad_sq` = `|G|²`, `total` = `tr Σ` per prompt (floats,
    or tensors of the inputs' shape: many steps at once)."""

    grad_sq: float | Tensor
    total: float | Tensor


def two_batch_noise(
    small_sq: float | Tensor, big_sq: float | Tensor, b_small: float, b_big: float
) -> TwoBatch:
    """`|G|²` and `tr Σ` (module docstring) from `small_sq` = `|g_small|²`, the squared norm of
    a gradient over `b_small` prompts (averaged over the processes' local gradients), and
    `big_sq` = `|g_big|²`, that of their mean over `b_big` prompts (floats, or tensors of one
    shape, elementwise). Raises InputError unless
    `0 < b_small < b_big`."""
    if not 0 < b_small < b_big:
        raise InputError(
            f"the two batch sizes must satisfy 0 < B_small < B_big; got B_small = {b_small}, "
            f"B_big = {b_big}."
        )
    grad_sq = (b_big * big_sq - b_small * small_sq) / (b_big - b_small)
    total = (small_sq - big_sq) / (1 / b_small - 1 / b_big)
    return TwoBatch(grad_sq, total)
