"""`make bench-gpu`'s runner on the CPU (bench/row_runner.py, bench/gpu.py): every row in its own
process under a time limit, printed as it finishes, a row past its limit killed (its children
too) and reported as timed out, the budget of the whole run capping each limit and skipping what
it no longer covers; gpu.py's rows, their limits and the live trainer's row. No CUDA needed: the
jobs here are small Python children that print, fail, sleep or start children of their own."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))

import row_runner  # noqa: E402
from row_runner import Job, Outcome, python, run_jobs  # noqa: E402


def child(code: str) -> list[str]:
    return python("-c", code)


def test_rows_run_in_order_each_printed_as_it_finishes() -> None:
    said: list[str] = []
    outcomes = run_jobs(
        [
            Job("prints", child('print("hello"); print("RESULT " + \'{"value": 2.5}\')'), 30),
            Job("fails", child("import sys; print('broken'); sys.exit(3)"), 30),
        ],
        budget_s=120,
        say=said.append,
    )
    assert [o.status for o in outcomes] == ["done", "failed"]
    assert outcomes[0].result == {"value": 2.5} and outcomes[1].result is None
    assert outcomes[1].returncode == 3 and outcomes[1].tail == ["broken"]
    # streamed in order: each job's output, then its line, before the next job starts
    assert said.index("| hello") < said.index(outcomes[0].line()) < said.index("| broken")
    assert said[-1] == outcomes[1].line() and outcomes[1].line().endswith("(limit 30 s, exit 3)")
    assert not any(line.startswith("| RESULT") for line in said)  # figures are not echoed


def test_a_row_past_its_limit_is_killed_with_its_children_and_the_next_one_runs() -> None:
    """The job starts a child of its own and sleeps: both are gone once the limit is reached,
    the job is reported as timed out, and the next job still runs."""
    sleeper = (
        "import subprocess, sys, time\n"
        "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'])\n"
        "print(p.pid, flush=True)\n"
        "time.sleep(120)\n"
    )
    t0 = time.monotonic()
    outcomes = run_jobs(
        [Job("hangs", child(sleeper), 3), Job("after", child("print('ok')"), 30)],
        budget_s=120,
        say=lambda _: None,
    )
    hung, after = outcomes
    assert hung.status == "timed out" and hung.returncode is None
    assert 3 <= hung.seconds < 15 and time.monotonic() - t0 < 60
    assert hung.line().startswith("hangs: timed out in ") and "limit 3 s" in hung.line()
    grandchild = int(hung.tail[0])
    for _ in range(50):  # reparented and reaped once killed
        try:
            os.kill(grandchild, 0)
        except ProcessLookupError:
            break
        time.sleep(0.1)
    else:
        pytest.fail(f"the row's own child {grandchild} outlived its limit")
    assert after.status == "done" and after.tail == ["ok"]


def test_the_budget_caps_each_limit_and_skips_what_it_no_longer_covers() -> None:
    """A clock: the first job starts with 15 s of a 15 s budget left (its 100 s limit capped to
    15); the second finds 5 s left, under `MIN_START_S`, and is not run."""
    ticks = iter([0.0, 0.0, 10.0])
    outcomes = run_jobs(
        [Job("first", child("pass"), 100), Job("second", child("pass"), 100)],
        budget_s=15,
        say=lambda _: None,
        clock=lambda: next(ticks),
    )
    assert outcomes[0].status == "done" and outcomes[0].limit_s == 15
    assert outcomes[1].status == "not run" and "budget" in outcomes[1].line()
    assert row_runner.MIN_START_S == 10


@pytest.fixture
def gpu(monkeypatch: pytest.MonkeyPatch):
    from test_bench_scripts import script_module

    return script_module("gpu.py", monkeypatch)


def test_gpu_rows_each_get_a_process_a_limit_and_the_live_trainer_its_own(gpu) -> None:
    names = [row.name for row, _, _ in gpu.plan_rows(False)] + [gpu.LIVE]
    assert set(gpu.LIMITS) == set(names)  # every row has its limit, no limit lacks a row
    jobs = gpu.jobs(names, tiny=False, reps=None)
    assert [j.name for j in jobs] == names
    assert all(j.limit_s == gpu.LIMITS[j.name] for j in jobs)
    live = jobs[-1]
    assert live.argv[-2:] == [str(BENCH / "bench_live.py"), "--gpu"]
    assert live.limit_s == 150
    row = jobs[0].argv
    assert row[0] == sys.executable and row[-2:] == ["--row", names[0]]
    assert gpu.jobs(names[:1], tiny=True, reps=2)[0].argv[-3:] == ["--tiny", "--reps", "2"]
    assert gpu.BUDGET_S == 480  # 8 minutes of rows, then pytest -m gpu tests/gpu
    assert gpu.REPS["rollouts sample"] == 3  # issue 41's target is over 3 repetitions


def test_a_row_without_figures_reports_why(gpu) -> None:
    planned = {row.name: (row, s, m) for row, s, m in gpu.plan_rows(True)}
    timed_out = gpu.row_of(Outcome("energy statistics", "timed out", 80.2, 80), planned)
    assert timed_out.value is None
    assert timed_out.error == "energy statistics: timed out in 80 s (limit 80 s)"
    assert timed_out.target == 1.15  # the row keeps its shape and target in the table
    no_flag = gpu.row_of(Outcome(gpu.LIVE, "failed", 9.0, 150, 2), planned)
    assert no_flag.error == f"{gpu.LIVE}: failed in 9 s (limit 150 s, exit 2)"
    ran = gpu.row_of(Outcome(gpu.LIVE, "done", 140.0, 150, 0), planned)
    assert ran.error is None and "its output above" in ran.detail
    measured = {"name": "statistics pass", "shape": "s", "value": 1.1, "target": 1.15}
    assert gpu.row_of(Outcome("statistics pass", "done", 20, 30, 0, measured), planned).met


def test_unknown_rows_are_refused_with_the_list(gpu, capsys) -> None:
    assert gpu.main(["--tiny", "--only", "full mode T=2049"]) == 2
    err = capsys.readouterr().err
    assert "no row named 'full mode T=2049'" in err and "full mode T=2048" in err


@pytest.mark.slow  # a child process imports torch and transformers, and measures a tiny row
def test_gpu_py_runs_each_row_in_a_child_and_prints_its_figures(gpu, capsys) -> None:
    assert gpu.main(["--tiny", "--reps", "1", "--only", "statistics pass"]) == 0
    out = capsys.readouterr().out.splitlines()
    rows = json.loads(out[-1])["rows"]
    assert [r["name"] for r in rows] == ["statistics pass"] and rows[0]["value"] > 0
    assert any(line.startswith("| statistics pass ") for line in out)  # the child's own line
    assert any(line.startswith("statistics pass: done in ") for line in out)
