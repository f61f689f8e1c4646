"""Where a live step's metrics are computed: a child Python process beside the trainer.

A thread in the trainer's process overlapped nothing: the metrics are hundreds of small
operations whose Python side holds the interpreter lock, so every millisecond of them was a
millisecond the training loop (on a GPU, its kernel launches) waited for (issue 48: the default
`attach` added the whole of `measure` to the toy's step). A child process has its own
interpreter: the trainer's thread pays only for handing the step over (pickling its CPU
tensors into a pipe) and for reading the metrics back.

    worker = shared_worker()          # one child per Python process, started once, kept
    ticket = worker.submit(fn, *args) # fn: a module-level function (pickled by name)
    value = worker.result(ticket)     # fn(*args) as the child returned it; WorkerError if it
                                      # raised (its message) or the child is gone

The child is `python -m otb_diag.integrations.core.worker READ_FD WRITE_FD`, started with
`subprocess` (not `multiprocessing`, whose spawn would import the user's training script again
in the child, running it where it is not guarded by `if __name__ == "__main__"`), on one torch
thread, importing the very `otb_diag` this process imports. It answers the jobs in the order
they came, so the tickets of several `LiveCore`s sharing it come back in order. It ends when
this process closes its end of the pipe (at exit, or when it dies).

Where no child can be started (`start` raises: no `fork`/`exec`, a sandbox), `LiveCore` falls
back to a thread and says so once.
"""

from __future__ import annotations

import atexit
import importlib
import os
import pickle
import subprocess
import sys
import threading
from collections.abc import Callable
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import otb_diag
from otb_diag.errors import InputError

READY = "ready"
MEASURING = "otb_diag.integrations.core.live_core"  # what the live core's jobs import
CLOSING_S = 30.0  # how long `close` waits for the child to end


class WorkerError(RuntimeError):
    """A job failed in the child (its `describe`d error), or the child is gone."""


class Worker:
    """One child process and the two pipes to it; `preload`: modules the child imports before
    its first job (while the trainer sets up). Thread-safe: `submit` and `result` take a lock,
    so two `LiveCore`s (or the trainer's thread and another) may share it."""

    def __init__(self, preload: tuple[str, ...] = ()) -> None:
        to_child, from_parent = os.pipe()
        from_child, to_parent = os.pipe()
        package_root = str(Path(otb_diag.__file__).resolve().parent.parent)
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH")) if p)
        env["OMP_NUM_THREADS"] = "1"  # a step's metrics are small: one core, not the trainer's
        try:
            self.process = subprocess.Popen(
                [sys.executable, "-m", __name__, str(to_child), str(to_parent), *preload],
                pass_fds=(to_child, to_parent),
                stdin=subprocess.DEVNULL,
                env=env,
            )
        finally:
            os.close(to_child)
            os.close(to_parent)
        self._out = Connection(from_parent, readable=False)
        self._in = Connection(from_child, writable=False)
        self._lock = threading.Lock()
        self._sent = 0  # tickets handed out
        self._answered: dict[int, tuple[bool, Any]] = {}  # read, not yet collected
        self._next_answer = 0  # the ticket the child answers next
        self._ready = False
        self.closed = False

    @property
    def pid(self) -> int:
        return self.process.pid

    def submit(self, fn: Callable[..., Any], *args: Any) -> int:
        """Queue `fn(*args)` in the child; its ticket. Raises `WorkerError` if the child is
        gone."""
        payload = pickle.dumps((fn, args), protocol=pickle.HIGHEST_PROTOCOL)
        with self._lock:
            ticket = self._sent
            try:
                self._out.send_bytes(payload)
            except OSError as e:
                raise WorkerError(self._gone(f"could not be handed the step ({e})")) from None
            self._sent += 1
            return ticket

    def result(self, ticket: int) -> Any:
        """What the child returned for `ticket`, waiting for it; `WorkerError` with the
        child's message if the job raised, or if the child ended first."""
        with self._lock:
            while ticket not in self._answered:
                try:
                    if not self._ready:
                        assert pickle.loads(self._in.recv_bytes()) == READY
                        self._ready = True
                        continue
                    ok, value = pickle.loads(self._in.recv_bytes())
                except (EOFError, OSError):
                    raise WorkerError(self._gone("ended before it answered")) from None
                self._answered[self._next_answer] = (ok, value)
                self._next_answer += 1
            ok, value = self._answered.pop(ticket)
        if not ok:
            raise WorkerError(value)
        return value

    def _gone(self, what: str) -> str:
        self.close()
        code = self.process.poll()
        status = f"exit code {code}" if code is not None else "still running"
        return f"otb-diag's worker process (pid {self.pid}) {what}: {status}"

    def close(self) -> None:
        """Close the pipes: the child ends at its next read, within `CLOSING_S` (a job in
        flight finishes first), or is killed."""
        if not self.closed:
            self.closed = True
            self._out.close()
            self._in.close()
            try:
                self.process.wait(timeout=CLOSING_S)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


_SHARED: Worker | None = None
_SHARED_LOCK = threading.Lock()


def shared_worker() -> Worker:
    """This process's worker, started at the first call (and again after one that ended);
    raises `OSError` where no child process can be started."""
    global _SHARED
    with _SHARED_LOCK:
        if _SHARED is None or _SHARED.closed or _SHARED.process.poll() is not None:
            _SHARED = Worker(preload=(MEASURING,))
            atexit.register(_SHARED.close)
        return _SHARED


def main(read_fd: int, write_fd: int, preload: list[str]) -> None:
    """The child: say it is ready, import `preload`, then answer each job `(fn, args)` with
    `(True, fn(*args))` or `(False, what failed)`, in order, until the parent closes its end.
    Torch, where a job uses it, runs on one thread (`OMP_NUM_THREADS=1` in its environment)."""
    inbox, outbox = Connection(read_fd, writable=False), Connection(write_fd, readable=False)
    outbox.send_bytes(pickle.dumps(READY))
    for module in preload:
        importlib.import_module(module)
    while True:
        try:
            job = inbox.recv_bytes()
        except EOFError:
            return
        try:
            fn, args = pickle.loads(job)
            answer = (True, fn(*args))
        except Exception as e:  # noqa: BLE001  said in the parent, which switches off alone
            answer = (False, describe(e))
        outbox.send_bytes(pickle.dumps(answer, protocol=pickle.HIGHEST_PROTOCOL))


def describe(error: Exception) -> str:
    """The sentence a warning gives of `error`: an `InputError`'s own or a `WorkerError`'s (the
    child's description already), else its type and text."""
    own = isinstance(error, InputError | WorkerError)
    return str(error) if own else f"{type(error).__name__}: {error}"


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3:])
