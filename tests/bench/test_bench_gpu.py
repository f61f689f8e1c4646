"""bench/bench_gpu.py without CUDA: says so and exits 0, quickly; its synthetic batch is what the
statistics pass expects."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest
import torch

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "bench_gpu.py"


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_without_cuda_it_says_skipped() -> None:
    result = subprocess.run(
        [sys.executable, str(SCRIPT)], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout == "skipped: no CUDA\n"


def test_synthetic_batch_is_one_response_of_the_asked_length() -> None:
    spec = importlib.util.spec_from_file_location("bench_gpu", SCRIPT)
    assert spec is not None and spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    batch = bench.one_response_batch(100)
    assert batch.response_ids.shape == (1, 100) and int(batch.length[0]) == 100
    assert len(batch.prompt_ids[0]) == bench.PROMPT
    assert int(batch.response_ids.max()) < bench.VOCAB and int(batch.mask.sum()) == 100
