"""The reverse-mode `full` engine: exact per-token gradients by `vjp`, then projected
(docs/theory.md §4).

For one response at a time and, within it, one chunk of tokens at a time, a forward pass over the
prefix the chunk needs and its backward passes vectorised over the chunk's tokens give the
gradients `s_t = ∇θ log p_t` of the selected parameters; the projection multiplies them by the
direction columns of `directions.py` block by block, `u_{t,b} = P_b s_{t,b}`, so its coordinates
are exactly the forward engine's `⟨v_{b,j}, s_t⟩`. It also gives the exact per-block
`‖s_{t,b}‖²`.

Cost per token: about `n · (6 L + 2 k)` flops (n selected parameters, L the prefix length,
k the directions), so it wins on short responses and loses on long ones (`cost.py`).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence

import torch
from torch import Tensor, nn
from torch.func import functional_call, vjp, vmap

from otb_diag.maths.response_batch import ResponseBatch
from otb_diag.policy.causal_lm import causal_lm
from otb_diag.policy.forward_pass import eval_mode
from otb_diag.policy.placement import host_batch
from otb_diag.policy.scores.directions import Block, projection_columns

# The direction columns are kept in memory up to this size and otherwise regenerated, a slice of
# directions at a time (at most `_COLUMN_SLICE_BYTES`), for every product.
HOLD_BYTES = 1 << 30
_COLUMN_SLICE_BYTES = 1 << 28

# Gradients of several responses are collected up to this size and projected in one product:
# every product reads all the columns, which cost more than the arithmetic when every few-token
# response was projected on its own (61 s of 67 s on the default, measured).
PENDING_BYTES = 1 << 28


class _Columns:
    """The direction columns `[numel, k_b]` of every selected parameter, held or regenerated."""

    def __init__(
        self, params: dict[str, Tensor], blocks: Sequence[Block], seed: int, device: torch.device
    ) -> None:
        self.params, self.blocks, self.seed, self.device = params, blocks, seed, device
        total = sum(params[n].numel() * b.k * 4 for b in blocks for n in b.params)
        self.held: dict[str, Tensor] | None = None
        if total <= HOLD_BYTES:
            self.held = {n: self._draw(b, n, range(b.k)) for b in blocks for n in b.params}

    def _draw(self, block: Block, name: str, directions: range) -> Tensor:
        numel = self.params[name].numel()
        return projection_columns(self.seed, directions, name, numel, block.k, self.device)

    def project(self, block: Block, name: str, g: Tensor) -> Tensor:
        """`g [rows, numel] @ columns [numel, k_b]` -> `[rows, k_b]`."""
        if self.held is not None:
            return g @ self.held[name]
        step = max(1, _COLUMN_SLICE_BYTES // (4 * self.params[name].numel()))
        return torch.cat(
            [
                g @ self._draw(block, name, range(lo, min(lo + step, block.k)))
                for lo in range(0, block.k, step)
            ],
            dim=1,
        )


def reverse_scores(
    model: nn.Module,
    batch: ResponseBatch,
    params: dict[str, Tensor],
    blocks: Sequence[Block],
    seed: int,
    chunk_size: int,
    progress: Callable[[int], None] | None = None,
) -> tuple[Tensor, Tensor]:
    """`proj [B, T, K]` (K = Σ_b k_b) and the exact `block_sq [B, T, n_blocks]` = `‖s_{t,b}‖²`,
    fp32 on the CPU, 0 at padding.

    params: the selected parameters (`directions.select_parameters`); the others are held fixed.
    Half-precision models give half-precision gradients, upcast to fp32 before the squares and
    the projection. Memory: one chunk's vectorised backward over one prefix, the pending
    gradients (`PENDING_BYTES`, or one chunk if larger) and the held columns (`HOLD_BYTES`).
    A PEFT wrapper runs as its causal LM (`causal_lm`), whose names `params` uses.
    """
    model = causal_lm(model)
    batch = host_batch(batch)  # its rows read on the host (any device given)
    device = next(iter(params.values())).device
    columns = _Columns(params, blocks, seed, device)
    n_rows, width = batch.response_ids.shape
    proj = torch.zeros(n_rows, width, sum(b.k for b in blocks))
    block_sq = torch.zeros(n_rows, width, len(blocks))
    n_params = sum(p.numel() for p in params.values())
    pending: list[tuple[int, int, dict[str, Tensor]]] = []  # (row, first t, {name: [c, numel]})
    pending_count = 0
    pending_rows = max(chunk_size, PENDING_BYTES // (4 * n_params))

    def project_pending() -> None:
        nonlocal pending_count
        for block in blocks:
            cols = slice(block.offset, block.offset + block.k)
            u = sum(
                columns.project(block, name, torch.cat([g[name] for _, _, g in pending]))
                for name in block.params
            ).cpu()  # u_{t,b} = Σ_{p ∈ b} (v_{b,j} restricted to p) · s_{t,p}
            at = 0
            for i, lo, g in pending:
                c = len(g[block.params[0]])
                proj[i, lo : lo + c, cols] = u[at : at + c]
                at += c
        pending.clear()
        pending_count = 0

    with eval_mode(model), warnings.catch_warnings():
        # The vectorised backward of CPU scaled-dot-product attention falls back to a loop and
        # says so on every call; the numbers are exact, only the warning would alarm users.
        warnings.filterwarnings("ignore", message=".*performance drop.*", category=UserWarning)
        for i, n_tok in enumerate(batch.length.tolist()):
            prompt = batch.prompt_ids[i]
            ids = torch.tensor(prompt + batch.response_ids[i, :n_tok].tolist(), device=device)
            tau = float(batch.temperature[i])
            for lo in range(0, n_tok, chunk_size):
                hi = min(lo + chunk_size, n_tok)
                # Causal: tokens lo … hi − 1 depend on the first P + hi − 1 positions only, so the
                # backward passes run over that prefix, not the whole row.
                logprobs = _logprob_fn(model, ids[: len(prompt) + hi], len(prompt) + lo, tau)
                _, pullback = vjp(logprobs, params)
                (grads,) = vmap(pullback)(torch.eye(hi - lo, device=device))  # {name: [c, ...]}
                g = {name: grads[name].flatten(1).float() for name in params}
                for b, block in enumerate(blocks):  # ‖s_{t,b}‖² = Σ_{p ∈ b} ‖∂ log p_t / ∂p‖²
                    block_sq[i, lo:hi, b] = sum(g[n].square().sum(-1) for n in block.params).cpu()
                pending.append((i, lo, g))
                pending_count += hi - lo
                if pending_count >= pending_rows:
                    project_pending()
            if progress is not None and n_tok:
                progress(n_tok)
        if pending:
            project_pending()
    return proj, block_sq


def _logprob_fn(
    model: nn.Module, ids: Tensor, first: int, tau: float
) -> Callable[[dict[str, Tensor]], Tensor]:
    """`params -> [L − first]` tempered fp32 log p of the tokens `ids[first:]` of one unpadded
    row; parameters absent from `params` keep the model's values."""

    def logprobs(params: dict[str, Tensor]) -> Tensor:
        out = functional_call(model, params, (ids[None],), {"use_cache": False})
        z = out.logits[0, first - 1 : -1].float() / tau  # the logits at j − 1 predict token j
        return torch.log_softmax(z, -1).gather(-1, ids[first:, None])[:, 0]

    return logprobs
