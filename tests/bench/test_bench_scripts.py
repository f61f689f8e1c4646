"""Every script of bench/ runs its smallest path to the end and prints its JSON line, so none can
rot unnoticed (bench_gpu.py crashed for a release on a renamed engine). Their numbers are not
judged here: speed targets live in the scripts, measured on a machine that is not under test."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import torch

BENCH = Path(__file__).resolve().parents[2] / "bench"
SMALLEST = {
    "bench_full.py": ["--models", "5M", "--lengths", "24,32", "--k", "2", "--prefix", "4",
                      "--directions", "2"],
    "bench_stats.py": ["--tiny"],
    "bench_variance.py": ["--draws", "2", "--sketch-dim", "4"],
    "bench_sample.py": ["--rows", "2", "--new", "4", "--reps", "1"],
    "bench_scale.py": ["--tiny"],
    "gpu.py": ["--tiny", "--reps", "1"],
    "bench_live.py": ["--rounds", "1", "--steps", "2"],
    "bench_train_compare.py": ["--steps", "2", "--seeds", "1", "--out",
                               str(Path(tempfile.gettempdir()) / "otb-bench-train-compare")],
}  # fmt: skip


def run(script: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    return subprocess.run(
        [sys.executable, str(BENCH / script), *args],
        capture_output=True, text=True, timeout=900, cwd=BENCH, env=env,
    )  # fmt: skip


def test_every_script_has_a_smallest_path() -> None:
    assert {p.name for p in BENCH.glob("*.py")} == set(SMALLEST)


@pytest.mark.slow
@pytest.mark.parametrize("script", sorted(SMALLEST))
def test_smallest_path_runs_to_its_json_line(script: str) -> None:
    result = run(script, *SMALLEST[script])
    assert result.returncode == 0, result.stderr[-4000:]
    record = json.loads(result.stdout.strip().splitlines()[-1])
    assert record  # a JSON line with the measurements, not an empty one
    if script == "gpu.py":  # every row measured, none broken
        assert all(r["error"] is None and r["value"] > 0 for r in record["rows"])
        assert len(record["rows"]) == 6


@pytest.mark.slow
def test_live_bench_builds_the_larger_random_body() -> None:
    result = run("bench_live.py", "--model", "small", "--rounds", "1", "--steps", "1")
    assert result.returncode == 0, result.stderr[-4000:]
    model = json.loads(result.stdout.strip().splitlines()[-1])["model"]
    assert model["name"] == "small"
    assert model["parameters"] > 3_000_000  # 256 wide, 4 layers; the embedded one has ~0.6M


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_gpu_bench_without_cuda_says_skipped() -> None:
    result = run("gpu.py")
    assert result.returncode == 0, result.stderr
    assert result.stdout == "skipped: no CUDA\n"
