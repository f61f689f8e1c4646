"""Per-token statistics of the tempered policy, as formulas over logits or logged values
(docs/theory.md §1–2).

With `π_t = softmax(z_t / τ)` and `p_t = π_t(y_t)`, every response token gets
`logprob = log p_t`, `prob = p_t`, `sum_pi2 = Σ_v π_t(v)²`, `entropy = −Σ_v π_t(v) log π_t(v)` and
the logit-gradient proxy `w = (1 − 2 p_t + sum_pi2) / τ² = ‖∂ log p_t / ∂z_t‖²`; the realized
energy accumulates `w` along the response. Running a model to get the logits is
`policy/forward_pass.py`'s job; nothing here touches a model.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from otb_diag.errors import InputError
from otb_diag.maths.response_batch import ResponseBatch


@dataclass(frozen=True)
class TokenStats:
    """Per-token statistics, every field of the same shape `[...]` (e.g. `[B, T]`), fp32.

    `h_sq` is `‖h_t‖²` of the final hidden state (as it enters the output layer); it is `None`
    when the statistics come from logits alone.
    """

    logprob: Tensor
    prob: Tensor
    sum_pi2: Tensor
    entropy: Tensor
    w: Tensor
    h_sq: Tensor | None = None


def stats_from_logits(
    logits: Tensor, targets: Tensor, temperature: float | Tensor = 1.0
) -> TokenStats:
    """Statistics of `softmax(logits / τ)` at `targets`, computed in fp32 whatever the input dtype.

    logits: `[..., V]` raw logits (may hold `-inf`; at least one entry per row must be finite).
    targets: `[...]` long, the sampled tokens `y_t`.
    temperature: a float or a tensor broadcastable to `targets`' shape `[...]`.
    Returns `TokenStats` of shape `[...]` (`h_sq` is None). The caller's `logits` are not modified.
    """
    tau = torch.as_tensor(temperature, dtype=torch.float32, device=logits.device)
    z = logits.to(torch.float32, copy=True)  # worked on in place below
    return _stats_in_place(z, targets, None if bool((tau == 1).all()) else tau, torch.empty_like(z))


def _stats_in_place(z: Tensor, targets: Tensor, tau: Tensor | None, e: Tensor) -> TokenStats:
    """`stats_from_logits` on fp32 logits `z [..., V]` that it may overwrite, as may it `e`.

    e: scratch of `z`'s shape and dtype (its contents are ignored); passing it lets a caller reuse
    one buffer across chunks, as a fresh multi-megabyte tensor costs page faults on first touch.
    tau: broadcastable to `targets`' shape, or None for τ = 1 (saves a pass over z).
    Eight passes over `[..., V]` (nine for τ ≠ 1), none allocating; the rest works on `[...]`.
    """
    if tau is not None:
        z.div_(tau[..., None])  # z_t / τ
    # Every statistic is shift-invariant; shifting by the max (exact in floating point) makes the
    # largest exp(z) equal 1, so nothing overflows and the normaliser s lies in [1, V]: log p keeps
    # its digits for logits of ±1e4.
    z.sub_(z.amax(-1, keepdim=True))
    torch.exp(z, out=e)
    y = targets[..., None]
    z_y, e_y = z.gather(-1, y)[..., 0], e.gather(-1, y)[..., 0]
    # The sums without the target: 1 − p and Σ_{v≠y} π_v² come out directly, without cancellation.
    e.scatter_(-1, y, 0.0)
    s_rest = e.sum(-1)  # s · (1 − p)
    # Σ_{v≠y} e_v z_v for the entropy. The only NaN is 0 · −inf from a −inf logit, a token of
    # probability 0 that adds nothing to −Σ π log π; nansum drops it (a NaN logit would still
    # spread through s to every statistic).
    ez_rest = z.mul_(e).nansum(-1)
    q_rest = e.square_().sum(-1)  # s² · Σ_{v≠y} π_v²
    s = s_rest + e_y  # Σ_v exp(z_v)
    log_s = s.log()
    logprob = z_y - log_s  # log p_t = z_y − logsumexp(z)
    prob = e_y / s
    sum_pi2 = (q_rest + e_y.square()) / s.square()  # Σ π² (= exp(lse(2z) − 2 lse(z)))
    # 0 · log 0 = 0 for a target of probability 0 (z_y = −inf).
    ez_y = torch.where(e_y > 0, e_y * z_y, 0.0)
    entropy = log_s - (ez_rest + ez_y) / s  # −Σ π log π = log s − Σ e_v z_v / s
    # 1 − 2p + Σπ² = (1 − p)² + Σ_{v≠y} π_v²; the right side has no cancellation as p → 1, where
    # the left side in fp32 loses every digit (and can even turn negative).
    w = (s_rest / s).square() + q_rest / s.square()
    if tau is not None:
        # The gradient of log p_t w.r.t. the raw logits is (e_y − π_t) / τ, hence the 1/τ².
        w = w / tau.square()  # w = (1 − 2p + Σπ²) / τ²
    return TokenStats(logprob, prob, sum_pi2, entropy, w)


def proxy_from_probs(prob: Tensor, sum_pi2: Tensor, temperature: float | Tensor = 1.0) -> Tensor:
    """`w = (1 − 2p + Σπ²) / τ²` from a logged probability and `sum_pi2` (model-free mode).

    Only the closed form is available without the logits, so it is clamped at 0 where rounding
    near p → 1 would make it negative (the exact value is ≥ (1 − p)²)."""
    return (1 - 2 * prob + sum_pi2).clamp_min(0) / torch.as_tensor(temperature) ** 2


def cumulative_energy(w: Tensor, mask: Tensor, is_weights: Tensor | None = None) -> Tensor:
    """Realized energy `W_t = Σ_{j ≤ t} mask_j · w_j` (inclusive of t).

    w: `[B, T]`; mask: `[B, T]` (bool or 0/1, 0 for tool output and padding). Returns `[B, T]`.
    is_weights: `[B, T]` truncated importance weights ρ: off-policy, `w_j ρ_j²` replaces `w_j`
    (docs/theory.md §3; verl weights each token before accumulating).
    """
    if is_weights is not None:
        w = w * is_weights**2
    return torch.cumsum(w * mask.to(w.dtype), dim=-1)


def sequence_energy(w: Tensor, mask: Tensor) -> Tensor:
    """Total realized energy `W(τ) = W_T` of each response: `[B, T], [B, T] -> [B]`.

    Masked positions add nothing, so `W_T` equals W at the last valid position whatever the padding.
    """
    return cumulative_energy(w, mask)[..., -1]


def logged_stats(batch: ResponseBatch, path: str = "rollouts") -> TokenStats:
    """Model-free statistics from the rollouts' own `logprobs` and `sum_pi2` (tempered, as the
    sampler saw them). Entropy needs the full distribution, so it is NaN; `h_sq` is None."""
    missing = [f for f in ("logprobs", "sum_pi2") if getattr(batch, f) is None]
    if missing:
        raise InputError(
            f"model-free mode needs per-token {' and '.join(missing)} on every row.",
            path=path,
            field=missing[0],
            hint="Give a checkpoint with --ckpt, or log old_log_probs and sum_pi_squared "
            "(verl: actor.calculate_sum_pi_squared) with the rollouts.",
        )
    prob = batch.logprobs.exp()
    w = proxy_from_probs(prob, batch.sum_pi2, batch.temperature[:, None]) * batch.valid
    return TokenStats(
        logprob=batch.logprobs * batch.valid,
        prob=prob * batch.valid,
        sum_pi2=batch.sum_pi2 * batch.valid,
        entropy=torch.full_like(prob, math.nan),
        w=w,
        h_sq=None,
    )
