"""The shell every command's recipe runs in: the torchrun session, the checks of how the model
is loaded, the staging folder and the record file. With the sharding of `runtime/sharded.py`,
the only place in `pipelines/` that knows there are ranks: a recipe's body runs the same on
every rank, and what only rank 0 holds (a merge, the result) is None on the others."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, TypeVar, cast

from otb_diag.io.atomic import staged_output, write_json
from otb_diag.io.load_options import LoadOptions
from otb_diag.pipelines.inputs import Say, silent
from otb_diag.runtime.torchrun import launched_world_size, session


class Recorded(Protocol):
    """A command's result: what its record file (summary.json, manifest.json) holds."""

    def to_json(self) -> dict[str, Any]: ...


R = TypeVar("R")  # a `Recorded` where the command writes a folder


@dataclass(frozen=True)
class Stage:
    """Where a recipe's body writes and speaks: `into` is the folder its files go to (on rank 0
    the staging folder inside --out, moved into it once the body returns; on the other ranks
    --out itself, where they write nothing; None for a command that writes no folder);
    `progress` shows its bars and `say` its notes, on rank 0 only."""

    into: Path | None
    progress: bool
    say: Say


def run_recipe(
    body: Callable[[Stage], R | None],
    *,
    out: Path | None = None,
    load: LoadOptions | None = None,
    record: str | None = "summary.json",
    progress: bool = True,
    say: Say = silent,
    every_rank: bool = True,
    staged: bool = True,
) -> R | None:
    """Run `body` in the torchrun session (a world of one without torchrun) and return its
    result on rank 0, None on the other ranks.

    load: how the command loads its model, checked first (`LoadOptions.check`: a device this
        machine lacks, a --device-map under torchrun), and the device whose backend the ranks
        join (nccl on CUDA); None for a command that loads no model (gloo, on the CPU).
    out: the output folder. Rank 0's body writes into a staging folder inside it, `record`
        (the result's `to_json()`) is written beside its files, and all move into `out`
        together, or none of them on an error (`io/atomic.py:staged_output`). None: the
        command writes no folder. A body that returns None on rank 0 (a run stopped early)
        leaves no record.
    every_rank: the body runs on every rank (it shards its work through `runtime/sharded.py`);
        False: on rank 0 alone, staged the same way, the other ranks waiting for its outcome
        (its error stops them too).
    staged: False for a command whose outputs cannot all wait for the end (train's
        metrics.jsonl, flushed step by step, so a stopped run keeps its finished steps): rank
        0's body writes into `out` itself as it goes, and `record` is written last."""
    device = "cpu"  # a command that loads no model (report, regress) stays free of torch
    if load is not None:
        from otb_diag.runtime.devices import resolve_device

        load.check(launched_world_size())
        device = resolve_device(load.device).type

    def on_rank_0() -> R | None:
        if out is None:
            return body(Stage(None, progress, say))
        with staged_output(out) if staged else _created(out) as into:
            result = body(Stage(into, progress, say))
            if result is not None and record is not None:
                write_json(into / record, cast(Recorded, result).to_json())
        return result

    with session(device) as d:
        if not every_rank:
            return d.on_main(on_rank_0)
        if not d.is_main:
            body(Stage(out, False, silent))
            return None
        return on_rank_0()


@contextlib.contextmanager
def _created(out: Path) -> Iterator[Path]:
    """`out`, created, for a body that writes there directly (`staged=False`)."""
    out.mkdir(parents=True, exist_ok=True)
    yield out
