"""The per-row noise of `rollouts sample` (`otb_diag/policy/noise.py`): SplitMix64 as published,
uniforms that are uniform, Gumbel-max draws that follow softmax(z/τ), a row's noise independent
of its batch, and one computation per step whatever the number of rows."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from scipy import stats
from torch.utils._python_dispatch import TorchDispatchMode

from otb_diag.policy.noise import GlobalRng, RowNoise, hash_uniforms
from otb_diag.policy.sampling import row_seed

MASK64 = (1 << 64) - 1


def splitmix64(state: int) -> tuple[int, int]:
    """SplitMix64 on Python ints (Steele, Lea and Flood 2014): (new state, output)."""
    state = (state + 0x9E3779B97F4A7C15) & MASK64
    z = state
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
    return state, z ^ (z >> 31)


def reference_uniform(seed: int, step: int, v: int) -> float:
    """u for (seed, step, token v) from the reference: the key is output step + 1 of the
    seed's stream, u the top 23 bits of output v + 1 of the key's stream, centred."""
    state = seed
    for _ in range(step + 1):
        state, key = splitmix64(state)
    state = key
    for _ in range(v + 1):
        state, out = splitmix64(state)
    return ((out >> 41) + 0.5) / 2**23


def test_uniforms_are_splitmix64_as_published() -> None:
    seeds = [0, 1, row_seed(0, 0, 0), row_seed(7, 3, 2), (1 << 63) - 1]
    u = hash_uniforms(torch.tensor(seeds), step=2, vocab=40)
    for b, seed in enumerate(seeds):
        for v in (0, 1, 17, 39):
            assert u[b, v].item() == reference_uniform(seed, 2, v)
    assert hash_uniforms(torch.tensor([5]), step=0, vocab=3)[0, 2] == reference_uniform(5, 0, 2)


def test_uniforms_are_uniform_and_unrelated_across_rows_steps_and_tokens() -> None:
    seeds = torch.tensor([row_seed(0, i, j) for i in range(8) for j in range(8)])  # [64]
    u = torch.stack([hash_uniforms(seeds, s, 1000) for s in range(3)])  # [3, 64, 1000]
    assert u.min() > 0 and u.max() < 1
    assert stats.kstest(u.flatten().double().numpy(), "uniform").pvalue > 1e-3
    # Neighbouring tokens, rows and steps: correlations of 64k pairs, |r| ~ 1/256 by chance.
    pairs = [
        (u[:, :, :-1], u[:, :, 1:]),
        (u[:, :-1], u[:, 1:]),
        (u[:-1], u[1:]),
    ]
    for a, b in pairs:
        r = np.corrcoef(a.flatten().numpy(), b.flatten().numpy())[0, 1]
        assert abs(r) < 5 / np.sqrt(a.numel())


@pytest.mark.parametrize("tau", [1.0, 0.6])
def test_gumbel_max_with_hash_uniforms_samples_softmax(tau: float) -> None:
    """Chi-square of 20,000 draws (one per row, every row its own seed) against softmax(z/τ),
    at two steps (the step is part of the counter)."""
    logits = torch.tensor([1.5, 0.2, -1.0, 0.7, 0.0, -2.5])
    n = 20_000
    noise = RowNoise([row_seed(1, 0, j) for j in range(n)])
    z = (logits / tau).expand(n, -1)  # [n, V] tempered logits
    p = torch.softmax(logits.double() / tau, -1).numpy()
    expected = p / p.sum() * n  # sums to n in float64, as chisquare checks
    for step in (0, 9):
        counts = torch.bincount(noise(z, step), minlength=len(logits)).double().numpy()
        assert stats.chisquare(counts, expected).pvalue > 1e-3


def test_truncated_tokens_are_never_drawn() -> None:
    z = torch.tensor([[2.0, float("-inf"), 0.5, float("-inf")]]).expand(5000, -1)
    tokens = RowNoise(range(5000))(z, 0)
    assert set(tokens.tolist()) == {0, 2}


@given(
    seeds=st.lists(st.integers(0, (1 << 63) - 1), min_size=2, max_size=6),
    step=st.integers(0, 10_000),
    which=st.integers(0, 5),
)
def test_a_row_draws_the_same_whatever_shares_its_batch(seeds: list[int], step: int, which: int):
    b = which % len(seeds)
    z = torch.randn(len(seeds), 50, generator=torch.Generator().manual_seed(step))  # [B, V]
    together = RowNoise(seeds)(z, step)
    alone = RowNoise([seeds[b]])(z[b : b + 1], step)
    assert together[b] == alone[0]
    u_together = hash_uniforms(torch.tensor(seeds), step, 50)
    assert torch.equal(u_together[b], hash_uniforms(torch.tensor(seeds[b : b + 1]), step, 50)[0])


class CountOps(TorchDispatchMode):
    """Counts the aten operators run inside it (a tensor op per call, whatever its size)."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        self.ops.append(str(func.overloadpacket))
        return func(*args, **(kwargs or {}))


RANDOM_OPS = ("uniform", "normal", "random", "rand", "bernoulli", "multinomial", "exponential")


def test_noise_of_a_step_is_the_same_few_ops_for_any_number_of_rows() -> None:
    """The per-row streams take a fixed number of tensor operations per step, none of them a
    random-number kernel, and leave torch's global RNG alone; 1 row or 300 alike."""
    counts = []
    for rows in (1, 7, 300):
        noise = RowNoise([row_seed(0, i, 0) for i in range(rows)])
        z = torch.zeros(rows, 33)
        before = torch.get_rng_state()
        with CountOps() as ops:
            noise(z, 4)
        assert torch.equal(before, torch.get_rng_state())
        assert not [op for op in ops.ops if any(r in op for r in RANDOM_OPS)], ops.ops
        counts.append(ops.ops)
    assert counts[0] == counts[1] == counts[2]
    assert len(counts[0]) < 40


def test_the_hash_scratch_is_a_chunk_of_ids_and_changes_no_bit(monkeypatch) -> None:
    """Ids hashed `HASH_COLUMNS` at a time: every int64 tensor the hash mixes is `[B, ≤ columns]`
    (its scratch bounded by the chunk, not by V), the uniforms are bit for bit those of hashing
    all ids at once, and the operations per step stay the same for any number of rows."""
    from otb_diag.policy import noise

    seeds = torch.tensor([row_seed(3, i, 1) for i in range(6)])
    whole = hash_uniforms(seeds, 2, 33)  # 33 ≤ HASH_COLUMNS: one chunk, every id at once
    assert noise.HASH_COLUMNS >= 33
    shapes = []
    real = noise._mix
    monkeypatch.setattr(
        noise, "_mix", lambda x, rounds=3: shapes.append(x.shape) or real(x, rounds)
    )
    monkeypatch.setattr(noise, "HASH_COLUMNS", 8)
    assert torch.equal(hash_uniforms(seeds, 2, 33), whole)
    assert shapes == [(6,), (6, 8), (6, 8), (6, 8), (6, 8), (6, 1)]  # the keys, then 5 chunks
    counts = []
    for rows in (1, 7, 300):
        with CountOps() as ops:
            RowNoise([row_seed(0, i, 0) for i in range(rows)])(torch.zeros(rows, 33), 4)
        counts.append(ops.ops)
    assert counts[0] == counts[1] == counts[2]
    # CUDA hashes every id at once (the same bits, as above); the CPU a chunk at a time
    assert noise.hash_columns(torch.device("cuda"), 49_152) == 49_152
    assert noise.hash_columns(torch.device("cpu"), 49_152) == noise.HASH_COLUMNS


def test_global_rng_is_one_multinomial_per_step_for_any_number_of_rows() -> None:
    for rows in (1, 50):
        with CountOps() as ops:
            GlobalRng()(torch.zeros(rows, 9), 0)
        assert sum("multinomial" in op for op in ops.ops) == 1
