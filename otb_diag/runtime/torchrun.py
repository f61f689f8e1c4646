"""Data parallel under `torchrun`, with torch.distributed: nccl on CUDA, gloo on the CPU.

`torchrun --nproc-per-node N --no-python otb-diag energy ...` starts N copies of the command with
`WORLD_SIZE`, `RANK`, `LOCAL_RANK` and the rendezvous address in their environment. Each copy
calls `session()`; with `WORLD_SIZE` > 1 it joins the process group, measures its share of the
groups (`shard_by_tokens`, through `sharded.py`) and hands its results to rank 0 (`Dist.gather`),
which alone writes files and prints. Without torchrun `session()` is a world of one and nothing
is initialised.

Failure handling, so that one rank's problem never leaves the others hanging:
- a phase of a command is a function decorated with `@agreed` (or one call `Dist.checked(fn)`):
  it runs on every rank, then the ranks agree on the outcome: if any rank raised, every rank
  raises the first failing rank's error (the CLI prints it on rank 0 only). The science inside
  a phase never sees ranks; `sharded.py:Shards.run` is the one way work is shared and gathered.
- every collective has a timeout (`OTB_DIAG_DIST_TIMEOUT_S`, default 1800 s), and a lost peer
  (a killed rank) surfaces as `DistributedError`, not a hang;
- SIGTERM (what torchrun sends to the survivors when a rank dies) raises `SystemExit`, so the
  atomic writers' clean-up runs and no temporary file is left in `--out`;
- a run that succeeds ends with a barrier, so no rank shuts its process group down while
  another still uses it.
"""

from __future__ import annotations

import contextlib
import datetime
import functools
import heapq
import os
import signal
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, ParamSpec, TypeVar

from otb_diag.errors import InputError

# torch is imported where a collective runs, not here: every command imports this module (for
# `DistributedError`), and a plain process should not pay for torch unless it measures.

T = TypeVar("T")
P = ParamSpec("P")

DEFAULT_TIMEOUT_S = 1800


class DistributedError(RuntimeError):
    """A rank failed or was lost; the message says which and why."""


@dataclass(frozen=True)
class Dist:
    """This process's place in the job: `rank` of `world_size` (1 without torchrun)."""

    rank: int = 0
    world_size: int = 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def gather(self, obj: T) -> list[T] | None:
        """Every rank's `obj`, in rank order, on rank 0 (None on the others)."""
        if self.world_size == 1:
            return [obj]
        import torch.distributed as dist

        out: list[Any] | None = [None] * self.world_size if self.is_main else None
        _collective(lambda: dist.gather_object(obj, out, dst=0))
        return out

    def all_gather(self, obj: T) -> list[T]:
        """Every rank's `obj`, in rank order, on every rank."""
        if self.world_size == 1:
            return [obj]
        import torch.distributed as dist

        out: list[Any] = [None] * self.world_size
        _collective(lambda: dist.all_gather_object(out, obj))
        return out

    def on_main(self, fn: Callable[[], T]) -> T | None:
        """`fn()` on rank 0 (None elsewhere), with every rank raising its error (`checked`)."""
        return self.checked(lambda: fn() if self.is_main else None)

    def checked(self, fn: Callable[[], T]) -> T:
        """Run `fn` on this rank; then, on every rank, raise the first failing rank's error."""
        if self.world_size == 1:
            return fn()
        result: Any = None
        failure: tuple[str, Any] | None = None
        try:
            result = fn()
        except InputError as err:
            failure = ("input", err)
        except Exception as err:  # any other fault must still stop every rank, with its error
            failure = ("fault", f"{type(err).__name__}: {err}")
        failures = [(r, f) for r, f in enumerate(self.all_gather(failure)) if f is not None]
        if not failures:
            return result
        rank, (kind, payload) = failures[0]
        if kind == "input":
            raise payload
        raise DistributedError(f"rank {rank} of {self.world_size} failed: {payload}")


_current: Dist | None = None


def current() -> Dist:
    """The `Dist` of the running `session()`, or a world of one."""
    return _current or Dist()


def agreed(fn: Callable[P, T]) -> Callable[P, T]:
    """Make `fn` one phase of a command: every rank runs it, then every rank raises the first
    failing rank's error (`Dist.checked` of the running `session()`). Every rank must call it,
    in the same order: it is a collective."""

    @functools.wraps(fn)
    def phase(*args: P.args, **kwargs: P.kwargs) -> T:
        return current().checked(lambda: fn(*args, **kwargs))

    return phase


def launched_world_size() -> int:
    """How many ranks torchrun started (its `WORLD_SIZE`; 1 in a plain process), known before
    `session()` joins them."""
    return int(os.environ.get("WORLD_SIZE", "1"))


@contextlib.contextmanager
def session(device: str = "cpu") -> Iterator[Dist]:
    """Join the torchrun job described by the environment (nccl when `device` is CUDA, gloo
    otherwise), yield this rank's `Dist`, and leave the group at the end. A plain process (no
    `WORLD_SIZE` or `WORLD_SIZE=1`) gets `Dist()` and touches nothing."""
    global _current
    if launched_world_size() <= 1 or _current is not None:
        yield current()
        return
    import torch
    import torch.distributed as dist

    # Import the model stack before the group exists. torch.distributed.fsdp, which transformers
    # imports (through torch._dynamo), binds `dist.group.WORLD` as a default argument when it is
    # first imported: imported after init_process_group, it keeps the group, and gloo's threads,
    # alive past destroy_process_group into interpreter teardown, where they sometimes abort the
    # rank (SIGABRT, "terminate called without an active exception") after its work is done.
    import transformers.modeling_utils  # noqa: F401

    backend = "nccl" if device.startswith("cuda") else "gloo"
    if backend == "nccl":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    timeout = float(os.environ.get("OTB_DIAG_DIST_TIMEOUT_S", DEFAULT_TIMEOUT_S))
    previous = signal.signal(signal.SIGTERM, _exit_on_sigterm)
    dist.init_process_group(backend, timeout=datetime.timedelta(seconds=timeout))
    _current = Dist(dist.get_rank(), dist.get_world_size())
    try:
        yield _current
        # Leave together: a rank that tears gloo down while rank 0 is still writing (and its
        # pairs still open) can abort in gloo's shutdown. Skipped on an error, whose peers are
        # stopped by `checked` or by torchrun's SIGTERM instead.
        _collective(dist.barrier)
    finally:
        _current = None
        with contextlib.suppress(Exception):
            dist.destroy_process_group()
        signal.signal(signal.SIGTERM, previous)


def shard_by_tokens(sizes: Sequence[int], world_size: int) -> list[list[int]]:
    """Indices of `sizes` (tokens per group) split into `world_size` shards of nearly equal
    total: largest first, each to the shard with the fewest tokens so far (ties: lowest rank);
    each shard's indices come back sorted, so every rank keeps the file's group order."""
    shards: list[list[int]] = [[] for _ in range(world_size)]
    heap = [(0, r) for r in range(world_size)]
    for i in sorted(range(len(sizes)), key=lambda i: (-sizes[i], i)):
        total, r = heapq.heappop(heap)
        shards[r].append(i)
        heapq.heappush(heap, (total + sizes[i], r))
    return [sorted(s) for s in shards]


def require_groups(n_groups: int, d: Dist, what: str) -> None:
    """More ranks than groups leaves a rank with nothing to measure: refuse, as bad input."""
    if n_groups < d.world_size:
        raise InputError(
            f"{d.world_size} ranks but only {n_groups} group(s) in {what}: every rank needs at "
            "least one group.",
            field="nproc-per-node",
            hint=f"Run with --nproc-per-node {max(1, n_groups)} or fewer.",
        )


def _collective(op: Callable[[], None]) -> None:
    import torch.distributed as dist

    try:
        op()
    except (RuntimeError, dist.DistBackendError) as err:
        raise DistributedError(
            f"lost contact with another rank ({type(err).__name__}: {str(err).splitlines()[0]}); "
            "it was killed or failed, or a collective timed out (OTB_DIAG_DIST_TIMEOUT_S)."
        ) from None


def _exit_on_sigterm(signum: int, frame: Any) -> None:
    raise SystemExit(128 + signum)
