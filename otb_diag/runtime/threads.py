"""How many threads torch runs a command on, and how its idle threads wait.

The count, resolved once at a command's entry (`command_threads`), first that applies:

1. `--threads N` (the `THREADS` knob of the commands that run a model);
2. the user's `OMP_NUM_THREADS` or `MKL_NUM_THREADS`, which torch reads itself (`ENV`);
3. the size of the work (`choose_threads`): a model of fewer than `SMALL_MODEL` parameters, or
   none, runs on one thread; a larger one, or one whose size cannot be read, on every core this
   process may use (`cores_available`).

Why a rule: the toy models' operations are too small to split. On 2 cores beside other work,
torch's default of one thread a core made the demo's `train` 7x slower than one thread (issue
53): each parallel region waits for its slowest thread, and a thread without a core waits for a
time slice (bench/bench_threads.py measures it, bench/README.md has the numbers). A model the
size of SmolLM2-135M has operations large enough to share.

How idle threads wait (`calm_waits`): torch's OpenMP (GNU libgomp) spins a waiting thread for
about 300,000 iterations before it sleeps. Beside another job that spinning takes the cores the
other threads are waiting for; `OMP_WAIT_POLICY=PASSIVE` makes them sleep at once (same bench).
libgomp reads it when torch loads, so the command line sets it before anything imports torch.

Not set: torch's inter-op pool (`set_num_interop_threads`). It is started by the first inter-op
task (`torch.jit.fork`), which no command runs, so it never exists.

The Python API leaves the process's threads as they are: only the command line applies this."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator, Mapping, MutableMapping
from dataclasses import dataclass

from otb_diag.errors import InputError
from otb_diag.knobs import Knob

AUTO = "auto"
# The variables torch reads for its own count, in the order it reads them (MKL's overrides).
ENV = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")
# A user's own wait settings for libgomp, left alone where set (GOMP_SPINCOUNT=300000 is
# libgomp's default spinning, as before `calm_waits`).
WAIT_ENV = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")
# Parameters from which a model's operations are worth sharing between threads. The toy labs'
# models have 0.6 and 0.9 million, SmolLM2-135M 135 million; bench/bench_threads.py's sweep
# (bench/README.md, "Model sizes"): under 10 M a second thread (passive waits) paid only for
# scoring 3.4 M on idle cores (0.87x); from 21 M it scores 19-35 % faster on idle cores and
# samples 23-24 % slower; beside a busy job one thread won at every size.
SMALL_MODEL = 10_000_000
NO_MODEL = 0  # the size of work that runs no model (energy --model-free)


def parse_threads(text: str) -> int | None:
    """`--threads`' text: `auto` -> None (the rule decides), a positive integer -> itself."""
    if text.strip().lower() == AUTO:
        return None
    try:
        count = int(text)
    except ValueError:
        count = 0
    if count < 1:
        raise InputError(
            f"--threads: must be a whole number from 1 up, or auto, got '{text}'",
            hint="(auto: one thread for a small model, every core for a large one)",
        )
    return count


def show_threads(count: int | None) -> str:
    """The inverse of `parse_threads`."""
    return AUTO if count is None else str(count)


THREADS = Knob(
    flag="--threads",
    cli=str,
    parse=parse_threads,
    show=show_threads,
    metavar="N|auto",
    help="Torch threads. auto: $OMP_NUM_THREADS (or $MKL_NUM_THREADS) where set, else one for "
    f"a model under {SMALL_MODEL // 1_000_000} million parameters (the toy labs' and none) and "
    "every core this process may use for a larger one (said on stderr).",
)


@dataclass(frozen=True)
class Threads:
    """A command's thread count, `count` None where torch keeps its own (read from `ENV`), and
    what chose it: `--threads`, the variable (`OMP_NUM_THREADS=2`) or `auto` with its reason."""

    count: int | None
    source: str
    why: str = ""

    def sentence(self) -> str:
        """What the command line says of an automatic choice: `--threads auto: 1 torch thread
        (a model of 0.621 million parameters, under 10 million)`."""
        plural = "s" if (self.count or 0) > 1 else ""
        return f"--threads {self.source}: {self.count} torch thread{plural} ({self.why})"


def choose_threads(
    given: int | None, parameters: int | None, env: Mapping[str, str], cores: int
) -> Threads:
    """The thread count of a command (module docstring): `given` (--threads; None: auto), else
    the user's `ENV` variable, else one thread where `parameters` (the largest model's; 0: no
    model) is under `SMALL_MODEL`, else `cores`. None parameters (a size that cannot be read
    without loading the model) count as large: torch's own default, as before the rule."""
    if given is not None:
        return Threads(given, "--threads")
    user = _users_variable(env)
    if user is not None:
        return user
    if parameters is not None and parameters < SMALL_MODEL:
        what = "no model" if parameters == NO_MODEL else f"a model of {_millions(parameters)}"
        return Threads(1, AUTO, f"{what}, under {_millions(SMALL_MODEL)} parameters")
    size = "of unknown size" if parameters is None else f"of {_millions(parameters)} parameters"
    return Threads(max(1, cores), AUTO, f"every core this process may use, for a model {size}")


def _users_variable(env: Mapping[str, str]) -> Threads | None:
    """The user's `ENV` variable where set (torch keeps its own count), the one torch obeys
    where both are; None where neither is."""
    for name in reversed(ENV):
        if env.get(name, "").strip():
            return Threads(None, f"{name}={env[name].strip()}")
    return None


def _millions(count: int) -> str:
    return f"{count / 1e6:.3g} million"


def allowed_cores() -> int:
    """The cores this process may run on: its affinity mask (taskset and container CPU sets
    narrow it), the machine's count where the platform has none."""
    allowed = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return max(1, allowed or 1)


def cores_available() -> int:
    """`allowed_cores`, at most torch's own count (physical cores, hyper-threads not counted)."""
    import torch

    return min(allowed_cores(), torch.get_num_threads())


@contextlib.contextmanager
def command_threads(given: int | None, parameters: Callable[[], int | None]) -> Iterator[Threads]:
    """Run the block on `choose_threads`' count (`parameters` is called only where the rule
    needs it: no checkpoint is read when --threads or the environment decides), and restore
    torch's count after it (a command run in-process, as by the tests, leaves the process's
    threads as they were)."""
    import torch

    before = torch.get_num_threads()
    decided = given is not None or _users_variable(os.environ) is not None
    size = None if decided else parameters()
    chosen = choose_threads(given, size, os.environ, cores_available())
    with torch_threads(chosen.count or before):
        yield chosen


@contextlib.contextmanager
def torch_threads(threads: int) -> Iterator[None]:
    """torch's intra-op thread count set to `threads` inside the block, restored after it."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def calm_waits(env: MutableMapping[str, str]) -> None:
    """`OMP_WAIT_POLICY=PASSIVE` in `env` unless the user set how libgomp waits (`WAIT_ENV`);
    effective only before torch is imported (module docstring)."""
    if not any(name in env for name in WAIT_ENV):
        env["OMP_WAIT_POLICY"] = "PASSIVE"
