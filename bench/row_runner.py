"""Run a bench's rows each in its own process under a time limit, printing each as it finishes:
what `make bench-gpu` needs to fit a short GPU loan (issue 48: a GPU is lent for about 15
minutes, by chance, and a row that hangs or runs long must not take the others with it).

A job is a command line with its own limit. `run_jobs` starts them one at a time, streams each
one's output as it comes (prefixed with `| `), kills a job that outlives its limit (its whole
process group: a bench's own children too), skips the jobs the total budget no longer covers,
and returns what happened to each: its exit code, seconds, the last line it printed that starts
with `RESULT ` (a JSON object: how a row hands its figures back), or why it has none. Nothing
here needs a GPU (tests/bench/test_row_runner.py runs it on sleeping and printing children).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

RESULT = "RESULT "  # a job's line that carries its figures, as JSON after the prefix
MIN_START_S = 10.0  # a job is not started with less of the budget left than this


@dataclass(frozen=True)
class Job:
    """One row: its name, its command line and the seconds it may run."""

    name: str
    argv: Sequence[str]
    limit_s: float


@dataclass
class Outcome:
    """What became of a job: `status` is `done` (exit 0), `failed` (another exit code),
    `timed out` (killed at `limit_s`) or `not run` (the budget was spent)."""

    name: str
    status: str
    seconds: float = 0.0
    limit_s: float = 0.0
    returncode: int | None = None
    result: dict | None = None
    tail: list[str] = field(default_factory=list)  # its last lines of output

    def line(self) -> str:
        """One line for the table: the status, with the seconds and the limit."""
        if self.status == "not run":
            return f"{self.name}: not run (the budget left was under {MIN_START_S:.0f} s)"
        code = "" if self.returncode in (0, None) else f", exit {self.returncode}"
        return (
            f"{self.name}: {self.status} in {self.seconds:.0f} s (limit {self.limit_s:.0f} s{code})"
        )


def run_jobs(
    jobs: Sequence[Job],
    budget_s: float,
    *,
    say: Callable[[str], None] = print,
    clock: Callable[[], float] = time.monotonic,
) -> list[Outcome]:
    """Run `jobs` in order, each under `min(limit_s, budget left)`; see the module docstring."""
    start = clock()
    outcomes = []
    for job in jobs:
        left = budget_s - (clock() - start)
        if left < MIN_START_S:
            outcome = Outcome(job.name, "not run")
        else:
            say(f"-- {job.name} (limit {min(job.limit_s, left):.0f} s)")
            outcome = run_job(job, min(job.limit_s, left), say)
        say(outcome.line())
        outcomes.append(outcome)
    return outcomes


def run_job(job: Job, limit_s: float, say: Callable[[str], None]) -> Outcome:
    """`job` in its own process group, its output streamed to `say` as `| line`, killed (the
    group) once it has run `limit_s` seconds."""
    t0 = time.monotonic()
    proc = subprocess.Popen(
        list(job.argv), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True, bufsize=1, env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )  # fmt: skip
    lines: list[str] = []
    reader = threading.Thread(target=_stream, args=(proc, lines, say), daemon=True)
    reader.start()
    try:
        proc.wait(timeout=limit_s)
        status = "done" if proc.returncode == 0 else "failed"
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        status = "timed out"
    reader.join(timeout=5)
    results = [line.removeprefix(RESULT) for line in lines if line.startswith(RESULT)]
    return Outcome(
        job.name, status, time.monotonic() - t0, limit_s,
        None if status == "timed out" else proc.returncode,
        json.loads(results[-1]) if results else None, lines[-20:],
    )  # fmt: skip


def _stream(proc: subprocess.Popen, lines: list[str], say: Callable[[str], None]) -> None:
    assert proc.stdout is not None
    for raw in proc.stdout:
        line = raw.rstrip("\n")
        lines.append(line)
        if not line.startswith(RESULT):
            say(f"| {line}")


def _kill_group(proc: subprocess.Popen) -> None:
    """The job's process group (the job and what it started), then the job itself."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def python(*args: str) -> list[str]:
    """A command line running this interpreter."""
    return [sys.executable, *args]
