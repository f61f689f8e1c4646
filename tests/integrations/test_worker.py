"""The live core's worker process (`integrations/core/worker.py`): jobs run in another process,
`submit` does not wait for them, their answers come back by ticket, a job's error comes back
as its message, and a worker that died is said to have died and replaced by the next call."""

from __future__ import annotations

import os
import pickle
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from otb_diag.integrations.core import worker as worker_module
from otb_diag.integrations.core.live_core import LiveCore, measured, registered_here
from otb_diag.integrations.core.worker import Worker, WorkerError, shared_worker
from otb_diag.maths.response_batch import ResponseBatch


def test_a_job_runs_in_another_process_on_one_thread() -> None:
    worker = shared_worker()
    assert worker.result(worker.submit(os.getpid)) == worker.pid != os.getpid()
    assert worker.result(worker.submit(torch.get_num_threads)) == 1
    assert shared_worker() is worker  # one per process, kept


def test_submit_does_not_wait_for_the_job(tmp_path: Path) -> None:
    """The job blocks on a FIFO until this process writes to it, which it does only after
    `submit` has returned: had `submit` waited for the job, this test would hang."""
    fifo = tmp_path / "release"
    os.mkfifo(fifo)
    worker = shared_worker()
    ticket = worker.submit(fifo.read_text)
    fifo.write_text("released")
    assert worker.result(ticket) == "released"


def test_answers_come_back_by_ticket() -> None:
    worker = shared_worker()
    first, second = worker.submit(abs, -3), worker.submit(divmod, 7, 2)
    assert worker.result(second) == (3, 1)
    assert worker.result(first) == 3


def test_a_jobs_error_comes_back_as_its_message_and_the_worker_goes_on() -> None:
    worker = shared_worker()
    with pytest.raises(WorkerError, match="ValueError: invalid literal for int"):
        worker.result(worker.submit(int, "x"))
    assert worker.result(worker.submit(len, "four")) == 4


def test_a_dead_worker_is_said_to_be_dead() -> None:
    worker = Worker()
    with pytest.raises(WorkerError, match=rf"pid {worker.pid}\) ended before it answered"):
        worker.result(worker.submit(os._exit, 3))
    assert worker.process.wait(timeout=30) == 3
    with pytest.raises(WorkerError, match="could not be handed the step"):
        worker.submit(len, "x")


def test_the_shared_worker_is_replaced_once_it_died(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(worker_module, "MEASURING", "json")  # a cheap child for this test
    dead = Worker()
    monkeypatch.setattr(worker_module, "_SHARED", dead)
    dead.process.kill()
    dead.process.wait(timeout=30)
    fresh = shared_worker()
    assert fresh is not dead and fresh.result(fresh.submit(len, "ok")) == 2


def toy_batch() -> ResponseBatch:
    gen = torch.Generator().manual_seed(0)
    logprobs = -torch.rand(8, 5, generator=gen)
    return ResponseBatch.from_padded(
        group_names=["a", "b"],
        group=torch.arange(8) // 4,
        prompt_ids=[[1, 2]] * 8,
        response_ids=torch.randint(3, 30, (8, 5), generator=gen),
        length=torch.tensor([5, 3, 4, 1, 5, 5, 2, 4]),
        temperature=0.8,
        step=3,
        reward=torch.tensor([1.0, 0, 0, 1, 0, 0, 0, 0]),
        logprobs=logprobs,
        sum_pi2=torch.exp(2 * logprobs) * 0.5 + 0.5,
        trainer_advantage=torch.randn(8, generator=gen),
    )


def test_the_core_measures_in_its_worker_what_it_measures_here(tmp_path: Path) -> None:
    """The metrics `submit` has the worker compute are those `measure` computes in this
    process, to the last bit, and the worker writes the step's dump."""
    batch, scores = toy_batch(), torch.randn(8, 5, 4, generator=torch.Generator().manual_seed(1))
    here = LiveCore(("grpo", {"eps": 1e-4}), None, "token-mean", measure_in="thread")
    there = LiveCore(("grpo", {"eps": 1e-4}), None, "token-mean", dump_dir=tmp_path / "dumps")
    expected = here.measure(batch, 3, scores)
    there.submit(batch, 3, scores)
    assert isinstance(there._worker, Worker)
    step, metrics = there.collect()
    assert step == 3
    same = {k: metrics[k] for k in expected}
    assert pickle.dumps(same) == pickle.dumps(expected)  # bit for bit, NaN for NaN
    assert (tmp_path / "dumps" / "step_000003.jsonl").is_file()


def test_a_failure_in_the_worker_switches_the_diagnostics_off(tmp_path: Path) -> None:
    """The dump directory turned into a file after the core was made: the worker's write fails,
    and `collect` raises its message, which an adapter's `guard` says once."""
    blocker = tmp_path / "dumps"
    core = LiveCore(None, None, "token-mean", dump_dir=blocker)
    blocker.write_text("not a directory")
    core.submit(toy_batch(), 1)
    with pytest.warns(
        RuntimeWarning, match="switched off at step 1: (IsADirectory|NotADirectory|FileExists)Error"
    ):
        core.guard(1, core.collect)
    assert not core.enabled


def test_measured_is_handed_over_by_name() -> None:
    """The worker is handed `measured` by its module and name, not a copy of its code."""
    assert pickle.loads(pickle.dumps(measured)) is measured


def test_a_baseline_of_the_users_own_is_measured_in_this_process(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The worker process knows the shipped baselines only: one the user registered (here a
    function of another module than otb-diag's) makes the core measure on a thread of this
    process."""
    from otb_diag.maths.estimators import registry

    assert registered_here() == []
    monkeypatch.setitem(registry.BASELINES, "mine", replace(registry.BASELINES["mean"], fn=abs))
    assert registered_here() == ["mine"]
    core = LiveCore(None, ["mean"], "token-mean")
    core.submit(toy_batch(), 2)
    assert core._thread is not None
    assert core.collect()[0] == 2
