"""Where a sampled token's randomness comes from: the two noise sources of the one sampler
(`otb_diag/policy/sampling.py:PolicySampler`).

A noise source maps tempered logits `z [B, V]` (already truncated when top-k/top-p ask) and the
step `s` (0 for a response's first token) to the drawn tokens `[B]`, each an exact sample of
`softmax(z_b)`:

- `RowNoise`, per-row streams (`rollouts sample`): the Gumbel-max trick
  `y_b = argmax_v (z_bv + g_bv)`, `g = −log(−log u)`, with `u_bv` a counter-based hash of
  (row seed, step, token id) (`hash_uniforms`): vectorized over `[B, V]` (the ids in chunks of
  `hash_columns`), the same operations per step whatever B, no generator and no RNG call, so a
  row draws the same whatever rows share its batch;
- `GlobalRng`, torch's global RNG (`train`, `lab build`): `torch.multinomial(softmax(z), 1)`,
  exactly the draw of Hugging Face's `generate(do_sample=True)` (its `_sample`: fp32 scores,
  divided by τ only when τ ≠ 1, softmax, one multinomial per step), so the embedded labs and
  `train`'s runs stay what they were when they were sampled with it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import torch
from torch import Tensor


class Noise(Protocol):
    """A noise source: tempered logits `z [B, V]` and the step → drawn tokens `[B]` (long)."""

    def __call__(self, z: Tensor, step: int) -> Tensor: ...


def _int64(c: int) -> int:
    """An unsigned 64-bit constant as the int64 with the same bits (torch has no uint64 ops)."""
    return c - (1 << 64) if c >= 1 << 63 else c


# SplitMix64 (Steele, Lea and Flood 2014; Java's SplittableRandom): the state advances by the
# golden-ratio increment γ, and each output is the state through `_mix`. It passes BigCrush.
_GAMMA = 0x9E3779B97F4A7C15
_GOLDEN = _int64(_GAMMA)
_MUL1 = _int64(0xBF58476D1CE4E5B9)
_MUL2 = _int64(0x94D049BB133111EB)
# u takes 2^23 equally spaced values: the centre of cell x, (x + ½)·2^-23, is exact in float32
# (24 significant bits), where 2^24 cells would round the top one's centre up to u = 1.
UNIFORM_BITS = 23
# Token ids hashed at once: the int64 scratch of `hash_uniforms` (three `[B, columns]` tensors at
# its peak) is half the `[B, V]` float32 uniforms at V = 49,152 (SmolLM2), where hashing every id
# at once held 6 × them (bench/README.md); the number of operations depends on V, not on B.
HASH_COLUMNS = 4096


def hash_columns(device: torch.device, vocab: int) -> int:
    """Token ids `hash_uniforms` hashes at once on `device`: `HASH_COLUMNS` on the CPU (the
    scratch above); on CUDA all V, as the three `[B, V]` int64 tensors (0.3 GB at B = 256,
    V = 49,152) cost less there than the ~12 launches of each of 12 chunks a step (the sampler
    ran at 0.88x a bare `generate` on an H200, issue 41)."""
    return vocab if device.type == "cuda" else HASH_COLUMNS


def _mix(x: Tensor, rounds: int = 3) -> Tensor:
    """SplitMix64's output function on int64 `x` (any shape), in place, returned; `rounds=2`
    leaves out the last xorshift `x ^= x >>> 31`, which changes only the low 33 bits.

    `x ^= x >>> k` needs a logical shift: torch's `>>` on int64 is arithmetic, so the bits it
    copies from the sign are masked off. Products wrap modulo 2^64 (two's complement), as the
    unsigned arithmetic of the reference does.
    """
    for shift, mul in ((30, _MUL1), (27, _MUL2), (31, None))[:rounds]:
        high = x >> shift
        high &= (1 << (64 - shift)) - 1  # x >>> shift
        x ^= high
        if mul is not None:
            x *= mul
    return x


def _stream_keys(seeds: Tensor, step: int) -> Tensor:
    """`[B]` int64: the key of each row's stream at `step`, output `step + 1` of SplitMix64
    seeded with the row's seed: `k_bs = mix(seed_b + γ·(s + 1))`."""
    return _mix(seeds + _int64(_GAMMA * (step + 1) % (1 << 64)))


def hash_uniforms(seeds: Tensor, step: int, vocab: int) -> Tensor:
    """`u [B, V]` float32 in (0, 1): `u_bv` a function of (seeds[b], step, v) alone.

    `u_bv = (⌊mix(k_bs + γ·(v + 1)) / 2^41⌋ + ½) / 2^23`: the top 23 bits of output `v + 1` of
    SplitMix64 from the stream key `k_bs` (`_stream_keys`), centred in its cell, so u is never 0
    or 1 and the Gumbel noise `−log(−log u)` stays finite (within [−2.82, 16.64]: the Gumbel tail
    beyond has probability 6e-8). Two rows' (or steps') streams overlap only when their keys
    differ by γ·d for some |d| < V: probability about 2V/2^64 per pair.
    seeds: `[B]` int64, the rows' seeds. The same operations whatever B: the ids are hashed
    `hash_columns` at a time into the `[B, V]` result, whose conversion and centring are exact
    (integers below 2^23, a power-of-two scale), so the chunking changes no bit.
    """
    keys = _stream_keys(seeds, step)[:, None]  # [B, 1]
    u = torch.empty(len(seeds), vocab, device=seeds.device)
    columns = hash_columns(seeds.device, vocab)
    for lo in range(0, vocab, columns):
        hi = min(lo + columns, vocab)
        ids = torch.arange(lo + 1, hi + 1, device=seeds.device)  # [c]: v + 1
        # Only the top 23 bits are kept: the last xorshift does not reach them.
        x = _mix(keys + ids * _GOLDEN, rounds=2)  # [B, c]
        x >>= 64 - UNIFORM_BITS
        x &= (1 << UNIFORM_BITS) - 1  # the top 23 bits, as a non-negative integer
        u[:, lo:hi] = x
    return u.add_(0.5).mul_(2.0**-UNIFORM_BITS)


class RowNoise:
    """Per-row streams: row b's token at step s from the Gumbel-max trick with
    `hash_uniforms(seeds, s, V)[b]` (module docstring)."""

    def __init__(self, seeds: Sequence[int]) -> None:
        self.seeds = torch.tensor(list(seeds), dtype=torch.int64)  # [B], moved to z's device

    def __call__(self, z: Tensor, step: int) -> Tensor:
        if self.seeds.device != z.device:
            self.seeds = self.seeds.to(z.device)  # once per batch
        t = hash_uniforms(self.seeds, step, z.shape[-1])  # [B, V], worked on in place
        t.log_().neg_().log_()  # t = log(−log u) = −g, g a standard Gumbel
        return torch.sub(z, t, out=t).argmax(-1)  # y = argmax_v (z_v + g_v) ~ softmax(z)


class GlobalRng:
    """Torch's global RNG, drawn as Hugging Face's `generate(do_sample=True)` draws (module
    docstring); seed it with `torch.manual_seed`."""

    def __call__(self, z: Tensor, step: int) -> Tensor:
        return torch.multinomial(z.softmax(-1), num_samples=1).squeeze(1)  # [B]
