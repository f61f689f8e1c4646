"""The plain PyTorch loop (`plain_loop.py`) under FSDP2, for
tests/integrations/test_live_sharded.py:

    torchrun --nproc-per-node 2 -- plain_fsdp.py OUT TAU STEPS_JSON

The embedded checkpoint is sharded by `fully_shard` (each transformer block, then the whole
model: every parameter, the output layer's included, a DTensor holding its share of the rows on
each process), each process samples and trains its share of each step's prompts, and the main
process measures each whole step the core gathered with the live core's metrics but the split
(which `attach` refuses under FSDP). The main process writes what it logged at each step,
`OUT/logged.json`; every process the warnings raised while it ran, `OUT/warnings{rank}.json`."""

from __future__ import annotations

import json
import os
import sys
import warnings
from dataclasses import asdict
from pathlib import Path

import torch.distributed as dist
from plain_loop import AGGREGATION, plain_loop
from torch.distributed.fsdp import fully_shard
from transformers import AutoModelForCausalLM, AutoTokenizer

from otb_diag.integrations.core.live_core import LiveCore
from otb_diag.io.scenarios import default_checkpoint
from otb_diag.runtime.torchrun import Dist, session


def main(out: Path, tau: float, steps: list[list[str]]) -> None:
    rank, world = dist.get_rank(), dist.get_world_size()
    model = AutoModelForCausalLM.from_pretrained(default_checkpoint())
    for block in model.transformer.h:
        fully_shard(block)
    fully_shard(model)
    tokenizer = AutoTokenizer.from_pretrained(default_checkpoint())
    record = out if rank == 0 else None
    core = LiveCore(("mean", {}), None, AGGREGATION, record_dir=record, place=Dist(rank, world))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        logged = plain_loop(model, tokenizer, core, steps, tau)
    said = [f"{w.category.__name__}: {w.message}" for w in caught]
    (out / f"warnings{rank}.json").write_text(json.dumps(said))
    if rank == 0:
        (out / "logged.json").write_text(json.dumps([asdict(s) for s in logged]))


if __name__ == "__main__":
    # The library's join and leave: a barrier before the group goes (runtime/torchrun.py:session).
    with session():
        main(Path(sys.argv[1]), float(sys.argv[2]), json.loads(sys.argv[3]))
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # written and left: no interpreter teardown (docs/live.md, known issue)
