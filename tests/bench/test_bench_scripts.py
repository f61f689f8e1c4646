"""Every script of bench/ runs its smallest path to the end and prints its JSON line, so none can
rot unnoticed (bench_gpu.py crashed for a release on a renamed engine). Their numbers are not
judged here: speed targets live in the scripts, measured on a machine that is not under test.

Each script's `main()` runs in this process (a fresh interpreter would pay torch's and
transformers' imports again, seconds a script); what a script itself runs in a fresh process
(the peak-memory children, the commands bench_scale measures) still runs in one, once for each
distinct kind (`ONCE`): the further calls of that kind reuse the first one's number."""

from __future__ import annotations

import functools
import importlib.util
import json
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

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
    "bench_live.py": ["--model", "small", "--rounds", "1", "--steps", "1"],
    "bench_train_compare.py": ["--steps", "2", "--seeds", "1"],
}  # fmt: skip
# A script's function that starts a fresh process, and what picks the path that process runs:
# bench_full's peak memory of one attention ("bare", chunked, eager) for each of its two
# lengths, bench_scale's commands (`energy`, `rollouts inspect`) for each of its two file sizes.
ONCE: dict[str, tuple[str, Callable[..., object]]] = {
    "bench_full.py": ("peak", lambda name, length, what, vocab: what),
    "bench_scale.py": ("run", lambda args: args[0]),
}
MARKS = {"bench_scale.py": [pytest.mark.torchrun]}  # its energy: 1 process against 2 gloo ranks


def script_module(script: str, monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    """bench/SCRIPT imported under its own name (tests/gpu/ would shadow `gpu`), with bench/ on
    the path for the scripts it imports; sys.path and sys.modules are restored after the test."""
    monkeypatch.syspath_prepend(str(BENCH))
    name = f"bench_script_{script.removesuffix('.py')}"
    spec = importlib.util.spec_from_file_location(name, BENCH / script)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, name, module)
    spec.loader.exec_module(module)
    return module


def once_per_kind(function: Callable, kind: Callable[..., object]) -> Callable:
    """`function`, run for real on the first call of each kind, its result reused after."""
    first: dict[object, object] = {}

    @functools.wraps(function)
    def wrapper(*args: object) -> object:
        key = kind(*args)
        if key not in first:
            first[key] = function(*args)
        return first[key]

    return wrapper


def run_main(
    script: str, args: list[str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> str:
    """What `python bench/SCRIPT ARGS` prints (it must exit 0), run in this process."""
    module = script_module(script, monkeypatch)
    if script in ONCE:
        name, kind = ONCE[script]
        monkeypatch.setattr(module, name, once_per_kind(getattr(module, name), kind))
    monkeypatch.setattr(sys, "argv", [str(BENCH / script), *args])
    threads = torch.get_num_threads()  # bench_sample sets its own
    try:
        assert module.main() in (None, 0)  # gpu.py returns its exit status
    finally:
        torch.set_num_threads(threads)
    return capsys.readouterr().out


def last_json(out: str) -> dict | list:
    return json.loads(out.strip().splitlines()[-1])


def test_every_script_has_a_smallest_path() -> None:
    assert {p.name for p in BENCH.glob("*.py")} == set(SMALLEST)


@pytest.mark.slow
@pytest.mark.parametrize(
    "script", [pytest.param(s, marks=MARKS.get(s, [])) for s in sorted(SMALLEST)]
)
def test_smallest_path_runs_to_its_json_line(
    script: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    args = SMALLEST[script] + (
        ["--out", str(tmp_path)] if script == "bench_train_compare.py" else []
    )
    record = last_json(run_main(script, args, monkeypatch, capsys))
    assert record  # a JSON line with the measurements, not an empty one
    if script == "gpu.py":  # every row measured, none broken
        assert all(r["error"] is None and r["value"] > 0 for r in record["rows"])
        assert len(record["rows"]) == 6
    if script == "bench_live.py":  # the larger random body, built from the embedded config
        assert record["model"]["name"] == "small"
        assert record["model"]["parameters"] > 3_000_000  # 256 wide, 4 layers; embedded ~0.6M


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_gpu_bench_without_cuda_says_skipped(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    assert run_main("gpu.py", [], monkeypatch, capsys) == "skipped: no CUDA\n"
