"""Memory and speed of `otb-diag energy --model-free` and `rollouts inspect` as the file grows.

Generates synthetic model-free rollouts (Parquet: ids, reward, logprobs, sum_pi2; seeded) of
about 3 M and 12.5 M response tokens, runs each command in a fresh process, and prints peak RSS
(`ru_maxrss` of the child), tokens/s and the ratios the issue sets as targets; then the wall time
of `energy` on the embedded default (checkpoint and rollouts) under `torchrun --nproc-per-node 2`
(gloo) against one process. Every timing is printed with the 1-minute load average beside it
(a shared machine slows everything by about load / cores), then one JSON line.

    python bench/bench_scale.py            # 3 M and 12.5 M tokens (several minutes, ~1 GB disk)
    python bench/bench_scale.py --quick    # 0.3 M and 1.25 M tokens
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from threads import add_threads, pin_threads

BIN = Path(sys.executable).parent / "otb-diag"
GIB = 1 << 30


def write_rollouts(path: Path, tokens: int, seed: int = 0, group_size: int = 16) -> int:
    """Synthetic groups of `group_size` responses of 50–600 tokens until `tokens` are written."""
    rng = np.random.default_rng(seed)
    writer, written, g = None, 0, 0
    while written < tokens:
        lengths = rng.integers(50, 600, group_size)
        rows = []
        for n in lengths:
            logp = -rng.exponential(0.5, n)
            p = np.exp(logp)
            rows.append(
                {
                    "group": f"g{g}",
                    "prompt_ids": rng.integers(0, 1000, 32).tolist(),
                    "response_ids": rng.integers(0, 1000, n).tolist(),
                    "reward": float(rng.integers(0, 2)),
                    "logprobs": logp.tolist(),
                    "sum_pi2": (p**2 + (1 - p) ** 2 * 0.1).tolist(),
                }
            )
        table = pa.Table.from_pylist(rows)
        writer = writer or pq.ParquetWriter(path, table.schema)
        writer.write_table(table)
        written += int(lengths.sum())
        g += 1
    writer.close()
    return written


# A fresh wrapper per command: its RUSAGE_CHILDREN peak is that one command's peak RSS (KiB).
_WRAPPER = (
    "import resource, subprocess, sys; subprocess.run(sys.argv[1:], check=True, "
    "capture_output=True); print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)"
)


def run(args: list[str]) -> tuple[float, float]:
    """Wall seconds and peak RSS (GiB) of one command in a fresh process."""
    t0 = time.perf_counter()
    out = subprocess.run(
        [sys.executable, "-c", _WRAPPER, str(BIN), *args], check=True, capture_output=True
    )
    return time.perf_counter() - t0, int(out.stdout) * 1024 / GIB


def torchrun_vs_one(tmp: Path) -> dict[str, float]:
    """Wall seconds of `energy` on the embedded default: 1 process, then 2 gloo ranks."""
    out: dict[str, float] = {}
    for n in (1, 2):
        launcher = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(n)]
        launcher += ["--master-addr", "127.0.0.1", "--master-port", str(29_400 + n)]
        cmd = [*launcher, "--no-python", str(BIN)] if n > 1 else [str(BIN)]
        t0 = time.perf_counter()
        subprocess.run(
            [*cmd, "energy", "--quiet", "--out", str(tmp / f"default{n}")],
            check=True,
            capture_output=True,
            env={**os.environ, "OMP_NUM_THREADS": "1"},
        )
        out[f"wall_s_{n}_process"] = time.perf_counter() - t0
        out[f"load_average_{n}_process"] = os.getloadavg()[0]
        print(
            f"energy, default, {n} process(es): {out[f'wall_s_{n}_process']:.1f} s "
            f"(load {out[f'load_average_{n}_process']:.1f})",
            flush=True,
        )
    out["two_over_one"] = out["wall_s_2_process"] / out["wall_s_1_process"]
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--tiny", action="store_true", help="smallest path (tests/bench/)")
    # 1: what the latest table's `energy --model-free` ran at (then pinned inside the command,
    # now the count it is given, auto's one where none is)
    add_threads(parser, 1)
    args = parser.parse_args()
    print(pin_threads(args.threads))  # the commands it times inherit it (torchrun's ranks: 1)
    sizes = (
        (20_000, 40_000) if args.tiny
        else (300_000, 1_250_000) if args.quick
        else (3_000_000, 12_500_000)
    )  # fmt: skip
    results = {"load_average": os.getloadavg(), "cores": os.cpu_count(), "threads": args.threads}
    with tempfile.TemporaryDirectory() as tmp:
        for n in sizes:
            path = Path(tmp) / f"r{n}.parquet"
            tokens = write_rollouts(path, n)
            wall, rss = run(
                [
                    "energy",
                    "--model-free",
                    "--rollouts",
                    str(path),
                    "--quiet",
                    "--out",
                    str(Path(tmp) / f"e{n}"),
                ]
            )
            energy_load = os.getloadavg()[0]
            iwall, irss = run(["rollouts", "inspect", str(path), "--json"])
            results[str(n)] = {
                "tokens": tokens,
                "energy_peak_rss_gib": rss,
                "energy_tokens_per_s": tokens / wall,
                "energy_load_average": energy_load,
                "inspect_peak_rss_gib": irss,
                "inspect_tokens_per_s": tokens / iwall,
                "inspect_load_average": os.getloadavg()[0],
            }
            r = results[str(n)]
            print(
                f"{tokens:,} tokens: energy --model-free {r['energy_tokens_per_s']:,.0f} tok/s, "
                f"peak RSS {rss:.2f} GiB (load {energy_load:.1f}); rollouts inspect "
                f"{r['inspect_tokens_per_s']:,.0f} tok/s, peak RSS {irss:.2f} GiB "
                f"(load {r['inspect_load_average']:.1f})",
                flush=True,
            )
        results["torchrun"] = torchrun_vs_one(Path(tmp))
    small, large = (results[str(n)] for n in sizes)
    results["rss_growth"] = large["energy_peak_rss_gib"] / small["energy_peak_rss_gib"] - 1
    results["targets"] = {
        "peak_rss_at_largest_le_1_gib": large["energy_peak_rss_gib"] <= 1.0,
        "rss_growth_le_30_percent": results["rss_growth"] <= 0.30,
        "energy_ge_300k_tokens_per_s": large["energy_tokens_per_s"] >= 300_000,
        "inspect_ge_1m_tokens_per_s": large["inspect_tokens_per_s"] >= 1_000_000,
    }
    print(json.dumps(results))


if __name__ == "__main__":
    main()
