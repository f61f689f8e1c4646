"""Random directions in parameter space for the `full`-mode projection (docs/theory.md §4), never
stored.

The projection of a per-token score `s_t ∈ R^D` is `u_t = P s_t` with `P`'s rows the directions
`v_1 … v_k`. Both score engines use the same `v_j`: the forward engine feeds `v_j` to a
Jacobian-vector product (`u_t(v_j) = ⟨v_j, ∇θ log p_t⟩`), the reverse engine multiplies the
per-token gradients by the columns `[v_1 … v_k]` restricted to one parameter at a time. Neither
holds a `k × D` matrix: the piece of `v_j` on a parameter tensor is regenerated on demand from
the key `(seed, j, crc32(name))` (zlib's CRC-32, stable across processes, unlike `hash`).

Blocks (docs/theory.md §4, "per parameter block"): the selected parameters are split into blocks
(`parameter_blocks`) and block b gets its own `k_b` directions `v_{b,j}`, zero outside the block,
entries `N(0, 1/k_b)` inside. The projection is block-diagonal, `u_t = ⊕_b P_b s_{t,b}`, so
`E‖u_t‖² = Σ_b ‖s_{t,b}‖² = ‖s_t‖²` and every block's variance, and their sum, are unbiased.
`v_{b,j}` restricted to a parameter is the same standard-normal draw, scaled by `1/√k_b`, whatever
the blocking: with one block it is the plain Gaussian JL projection `v_j ~ N(0, I/k)`.

Reproducibility: the key fixes the numbers for a given device type (CPU and CUDA generators
produce different streams from one seed), for every batching and engine.
"""

from __future__ import annotations

import math
import re
import zlib
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor, nn

from otb_diag.errors import InputError
from otb_diag.policy.causal_lm import causal_lm

# Generator stream of the full-mode directions (the head and proxy sketches use 0, 1 and 3).
STREAM_DIRECTIONS = 2

# A decoder layer: `model.layers.3.`, `transformer.h.3.`, `gpt_neox.layers.3.`,
# `model.decoder.layers.3.`, `blocks.3.` ...
_LAYER = re.compile(r"(?:^|\.)(?:layers|layer|h|blocks|block)\.(\d+)\.")


@dataclass(frozen=True)
class Block:
    """One parameter block: its name, its parameters (in `named_parameters` order) and the
    number `k` of directions drawn for it; its coordinates of `u_t` are `[offset, offset + k)`."""

    name: str
    params: tuple[str, ...]
    k: int
    offset: int


def _name_key(name: str) -> int:
    """A stable 32-bit key of a parameter name (CRC-32; Python's `hash` is salted per process)."""
    return zlib.crc32(name.encode("utf-8"))


def unit_pieces(
    seed: int,
    directions: Sequence[int],
    name: str,
    shape: Sequence[int],
    device: torch.device | str,
) -> Tensor:
    """`[len(directions), *shape]` fp32: `√k · v_j` on parameter `name` for each j, entries
    `N(0, 1)` drawn on `device` from the generator keyed by `(seed, j, crc32(name))`, each
    straight into its slice (no stacking copy; the caller applies `1/√k` where it is cheapest)."""
    out = torch.empty(len(directions), *shape, device=device)
    for piece, j in zip(out, directions, strict=True):
        state = np.random.SeedSequence([seed, STREAM_DIRECTIONS, j, _name_key(name)])
        generator = torch.Generator(device=device).manual_seed(int(state.generate_state(1)[0]))
        torch.randn(*shape, generator=generator, device=device, out=piece)
    return out


def projection_columns(
    seed: int, directions: Sequence[int], name: str, numel: int, k: int, device: torch.device | str
) -> Tensor:
    """`[numel, len(directions)]`: the columns `v_j` (j in `directions`) restricted to one
    flattened parameter, what the reverse engine multiplies gradients by (`g @ columns`)."""
    return unit_pieces(seed, directions, name, (numel,), device).T / math.sqrt(k)


def select_parameters(model: nn.Module, pattern: str | None) -> dict[str, Tensor]:
    """`{name: detached parameter}` of `model.named_parameters()` (tied tensors once; a PEFT
    wrapper's causal LM's, `causal_lm`, under its names) whose name matches the regular
    expression `pattern` (`re.search`). None selects the parameters that train, those that
    require a gradient: all of a loaded checkpoint, a PEFT policy's adapter (`lora_A`, `lora_B`
    …, whose gradient is what its optimizer steps along); all where none does. A pattern picks
    among all of them (`base_layer` selects a LoRA policy's frozen weights)."""
    named = list(causal_lm(model).named_parameters())
    params = {name: p.detach() for name, p in named}
    if pattern is None:
        training = {name: p.detach() for name, p in named if p.requires_grad}
        return training or params
    try:
        regex = re.compile(pattern)
    except re.error as exc:
        raise InputError(f"--params is not a regular expression: {exc}", field="params") from None
    chosen = {name: p for name, p in params.items() if regex.search(name)}
    if not chosen:
        shown = ", ".join(list(params)[:6])
        raise InputError(
            f"--params {pattern!r} matches none of the model's {len(params)} parameters",
            field="params",
            hint=f"Parameter names look like: {shown}, ...",
        )
    return chosen


def block_of(name: str, head_names: frozenset[str]) -> str:
    """The block of one parameter name: `head` (the output layer), `layer.<i>` (decoder layer i),
    `embeddings` (token/position embeddings), `final_norm` (other norms), or `other`."""
    if name in head_names:
        return "head"
    layer = _LAYER.search(name)
    if layer:
        return f"layer.{int(layer.group(1))}"
    lowered = name.lower()
    if "emb" in lowered or re.search(r"(?:^|\.)w[tp]e\.", lowered):
        return "embeddings"
    if "norm" in lowered or re.search(r"(?:^|\.)ln_f\.", lowered):
        return "final_norm"
    return "other"


def _block_order(block: str) -> tuple[int, int]:
    if block.startswith("layer."):
        return 1, int(block.split(".")[1])
    return {"embeddings": (0, 0), "final_norm": (2, 0), "other": (3, 0), "head": (4, 0)}[block]


def parameter_blocks(
    model: nn.Module,
    names: Sequence[str],
    *,
    by_block: bool,
    k: int,
    directions_per_block: int | None = None,
) -> list[Block]:
    """The blocks of the selected parameter `names`, each with its directions.

    by_block False: one block `all` with `k` directions. True: blocks from the names of any HF
    causal LM (`block_of`), ordered embeddings, layer.0 … layer.L−1, final_norm, other, head,
    each with `directions_per_block` directions (default `⌈k / n_blocks⌉`, so the total stays
    about k). A PEFT wrapper's names are its causal LM's (`causal_lm`).
    """
    if not by_block:
        return [Block("all", tuple(names), k, 0)]
    model = causal_lm(model)
    head = model.get_output_embeddings()
    head_names = frozenset(
        f"{prefix}.{local}"
        for prefix, module in model.named_modules()
        if module is head
        for local, _ in module.named_parameters(recurse=False)
    )
    groups: dict[str, list[str]] = {}
    for name in names:
        groups.setdefault(block_of(name, head_names), []).append(name)
    order = sorted(groups, key=_block_order)
    per_block = directions_per_block or -(-k // len(order))  # ⌈k / blocks⌉
    return [Block(b, tuple(groups[b]), per_block, i * per_block) for i, b in enumerate(order)]
