"""The plain PyTorch loop (`plain_loop.py`) under FSDP2, for
tests/integrations/test_live_sharded.py:

    torchrun --nproc-per-node 2 -- plain_fsdp.py OUT TAU STEPS_JSON SPLIT_K

The embedded checkpoint is sharded by `fully_shard` (each transformer block, the output layer,
then the whole model: every parameter a DTensor holding its share of the rows on each process;
the output layer in a group of its own, which FSDP2 reshards after its forward, so that the
split's scoring must gather it, `split_capture.py:whole_output_layer`), each process samples and
trains its share of each step's prompts and forms the split's scores of dimension SPLIT_K from
its own loss forward, and the main process measures each whole step the core gathered, with
every live metric. The main process writes what it logged at each step, `OUT/logged.json`;
every process the warnings raised while it ran, `OUT/warnings{rank}.json`."""

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


def main(out: Path, tau: float, steps: list[list[str]], split_k: int) -> None:
    rank, world = dist.get_rank(), dist.get_world_size()
    model = AutoModelForCausalLM.from_pretrained(default_checkpoint())
    for block in model.transformer.h:
        fully_shard(block)
    fully_shard(model.lm_head)  # resharded after its forward: the split must gather it
    fully_shard(model)
    tokenizer = AutoTokenizer.from_pretrained(default_checkpoint())
    record = out if rank == 0 else None
    core = LiveCore(("mean", {}), None, AGGREGATION, record_dir=record, place=Dist(rank, world))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        logged = plain_loop(model, tokenizer, core, steps, tau, split_k=split_k, from_loss=True)
    said = [f"{w.category.__name__}: {w.message}" for w in caught]
    (out / f"warnings{rank}.json").write_text(json.dumps(said))
    if rank == 0:
        (out / "logged.json").write_text(json.dumps([asdict(s) for s in logged]))


if __name__ == "__main__":
    # The library's join and leave: a barrier before the group goes (runtime/torchrun.py:session).
    with session():
        main(Path(sys.argv[1]), float(sys.argv[2]), json.loads(sys.argv[3]), int(sys.argv[4]))
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # written and left: no interpreter teardown (docs/live.md, known issue)
