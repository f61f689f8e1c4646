"""Every script of bench/ runs its smallest path to the end and prints its JSON line, so none can
rot unnoticed (bench_gpu.py crashed for a release on a renamed engine). Their numbers are not
judged here: speed targets live in the scripts, measured on a machine that is not under test.

Each script's `main()` runs in this process (a fresh interpreter would pay torch's and
transformers' imports again, seconds a script). Of the processes a script starts
(`in_process`), its own peak-memory children run in a fresh process once a script, the further
ones reusing the first's number; the `otb-diag` commands bench_scale measures run in this
process by the command line's `app` (the torchrun launcher left out: `energy` under torchrun is
tested in tests/test_torchrun.py). Figures are drawn, not rendered (`unwritten_figures`)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType, SimpleNamespace

import pytest
import torch
from otb_diag.cli.main import app
from real_model import tiny_smollm2
from small_runs import reduce_rollouts
from typer.testing import CliRunner
from unwritten_figures import unwritten_figures

BENCH = Path(__file__).resolve().parents[2] / "bench"
SMALLEST = {
    "bench_full.py": ["--models", "5M", "--lengths", "24,32", "--k", "2", "--prefix", "4",
                      "--directions", "2"],
    "bench_stats.py": ["--tiny"],
    "bench_variance.py": ["--draws", "2", "--sketch-dim", "4"],  # + --rollouts: 4 groups
    "bench_sample.py": ["--rows", "2", "--new", "4", "--reps", "1"],
    "bench_scale.py": ["--tiny"],
    # one setting: the demo's commands run in this process here (`run_main`), where a setting's
    # thread variables do not reach them; its first two (the second writes under out/)
    "bench_threads.py": ["--tiny", "--busy", "no", "--settings", "one", "--models", "toy",
                         "--reps", "1", "--commands", "2"],
    "gpu.py": ["--tiny", "--reps", "1", "--in-process"],
    "bench_host.py": ["--k", "2", "--reps", "1", "--plan", "2x2"],
    "bench_live.py": ["--model", "small", "--rounds", "1", "--steps", "1"],
    "bench_train_compare.py": ["--steps", "2", "--seeds", "1"],
    "bench_controller.py": ["toy", "--seeds", "1", "--updates", "2"],
    "bench_train_smollm2.py": ["--steps", "1", "--seeds", "1", "--prompts-per-step", "1",
                               "--max-tokens", "4"],  # + --ckpt: a tiny model, SmolLM2's tokenizer
}  # fmt: skip
MODULES = {"row_runner.py", "threads.py"}  # imported by the scripts (gpu.py's runner, the
# thread count), not run


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


def in_process(module: ModuleType) -> Callable[..., subprocess.CompletedProcess]:
    """`subprocess.run` for `module`: the script's own peak-memory child (`python SCRIPT
    --_memory ...`) in a fresh process once, its output reused for the further children (a peak
    measured in this process could be 0 MiB, a ratio's denominator); an `otb-diag` command in
    this process by its `app` (printing a stand-in peak RSS of 1 GiB, in KiB, where
    bench_scale's wrapper would print the child's)."""
    first: list[subprocess.CompletedProcess] = []

    def run(cmd: list, **kwargs: object) -> subprocess.CompletedProcess:
        cmd = [str(c) for c in cmd]
        if cmd[1] == module.__file__:
            first[:] = first or [subprocess.run(cmd, **kwargs)]
            return first[0]
        command = cmd[cmd.index(str(module.BIN)) + 1 :]
        result = CliRunner().invoke(app, command)
        assert result.exit_code == 0, (command, result.output)
        stdout = str(1 << 20) if "-c" in cmd[:2] else result.stdout
        return subprocess.CompletedProcess(cmd, 0, stdout)

    return run


def run_main(
    script: str, args: list[str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> str:
    """What `python bench/SCRIPT ARGS` prints (it must exit 0), run in this process."""
    module = script_module(script, monkeypatch)
    monkeypatch.setattr(
        module, "subprocess", SimpleNamespace(run=in_process(module)), raising=False
    )
    monkeypatch.setattr(sys, "argv", [str(BENCH / script), *args])
    threads = torch.get_num_threads()  # the scripts set their own (bench/threads.py)
    monkeypatch.setenv("OMP_NUM_THREADS", os.environ.get("OMP_NUM_THREADS", ""))  # restored
    try:
        with unwritten_figures():
            assert module.main() in (None, 0)  # gpu.py returns its exit status
    finally:
        torch.set_num_threads(threads)
    return capsys.readouterr().out


def last_json(out: str) -> dict | list:
    return json.loads(out.strip().splitlines()[-1])


def test_every_script_has_a_smallest_path() -> None:
    assert {p.name for p in BENCH.glob("*.py")} == set(SMALLEST) | MODULES


@pytest.mark.slow
@pytest.mark.parametrize(
    "script",
    [
        pytest.param(s, marks=pytest.mark.external) if s == "bench_train_smollm2.py" else s
        for s in sorted(SMALLEST)
    ],  # bench_train_smollm2 reads SmolLM2's tokenizer (downloaded once: external)
)
def test_smallest_path_runs_to_its_json_line(
    script: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    args = SMALLEST[script] + (
        ["--out", str(tmp_path)] if script.startswith(("bench_train_", "bench_controller")) else []
    )
    if script == "bench_train_smollm2.py":  # its smallest path trains 4 arms: not of 135 M
        args += ["--ckpt", str(tiny_smollm2(tmp_path / "tiny"))]
    if script == "bench_variance.py":  # 4 of the embedded default's 16 groups (of 32: N <= 16)
        args += ["--rollouts", str(reduce_rollouts(tmp_path / "r.jsonl", groups=4, responses=32))]
    record = last_json(run_main(script, args, monkeypatch, capsys))
    assert record  # a JSON line with the measurements, not an empty one
    if script == "gpu.py":  # every row measured, none broken
        assert all(r["error"] is None and r["value"] > 0 for r in record["rows"])
        assert len(record["rows"]) == 7  # full mode at T = 512, 2,048, 8,192, batch; 3 more
    if script == "bench_live.py":  # the larger random body, built from the embedded config
        assert record["model"]["name"] == "small"
        assert record["model"]["parameters"] > 3_000_000  # 256 wide, 4 layers; embedded ~0.6M
    if script == "bench_threads.py":  # the Makefile's demo read off it, its first two timed
        demo = ["rollouts inspect", "energy", "variance-compare", "train", "dynamics", "report"]
        module = script_module(script, monkeypatch)
        assert [module._label(args) for args in module.demo_commands()] == demo
        assert [(r["command"], r["setting"]) for r in record["demo"]] == [
            (command, "one") for command in demo[:2]
        ]
        assert [(r["model"], r["setting"]) for r in record["sweep"]] == [("toy", "one")]
    if script == "bench_train_smollm2.py":  # every arm trained, the comparison over all four
        assert [r["group_size"] for r in record["trained"]] == [4, 4, 4, 16]
        assert len(record["comparison"]) == 4
        assert record["paired"] == []  # one step: no trailing mean of 5 scores to pair


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_gpu_bench_without_cuda_says_skipped(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    assert run_main("gpu.py", [], monkeypatch, capsys) == "skipped: no CUDA\n"


def test_a_script_runs_at_its_documented_thread_count(monkeypatch: pytest.MonkeyPatch) -> None:
    """`--threads` defaults to $OMP_NUM_THREADS where set (a documented `OMP_NUM_THREADS=1 python
    bench/...` keeps its meaning), else to the script's own count; `pin_threads` sets torch's
    and the environment's for the processes the script starts, and says so with the load."""
    import argparse

    monkeypatch.syspath_prepend(str(BENCH))
    from threads import add_threads, pin_threads

    def default(env: str | None) -> int:
        if env is None:
            monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
        else:
            monkeypatch.setenv("OMP_NUM_THREADS", env)
        parser = argparse.ArgumentParser()
        add_threads(parser, 2)
        return parser.parse_args([]).threads

    assert (default(None), default("1"), default("3")) == (2, 1, 3)
    before = torch.get_num_threads()
    try:
        line = pin_threads(1)
        assert torch.get_num_threads() == 1 and os.environ["OMP_NUM_THREADS"] == "1"
        assert line.startswith(f"threads: 1 torch thread(s) on {os.cpu_count()} cores")
    finally:
        torch.set_num_threads(before)


def test_the_smollm2_pairs_are_seed_by_seed(monkeypatch: pytest.MonkeyPatch) -> None:
    """The paired difference of final scores: seed by seed over the seeds both arms finished
    with a score, its mean with Student's t interval (t_{0.975, 2} = 4.303)."""
    module = script_module("bench_train_smollm2.py", monkeypatch)
    finals = {("otb", 0): 0.5, ("otb", 1): 0.7, ("otb", 2): 0.4, ("otb", 3): 0.9,
              ("grpo", 0): 0.3, ("grpo", 1): 0.6, ("grpo", 2): 0.5, ("grpo", 3): None,
              ("grpo", 4): 0.2}  # fmt: skip
    row = module.paired_difference(finals, "otb", "grpo")
    assert row["differences"] == pytest.approx([0.2, 0.1, -0.1])  # seeds 0–2 only
    assert (row["seeds"], row["arm_higher"], row["mean"]) == (3, 2, pytest.approx(0.2 / 3))
    half = 4.302652729911275 * 0.15275252316519466 / 3**0.5  # sd of (0.2, 0.1, −0.1)
    assert (row["low"], row["high"]) == (
        pytest.approx(0.2 / 3 - half),
        pytest.approx(0.2 / 3 + half),
    )
