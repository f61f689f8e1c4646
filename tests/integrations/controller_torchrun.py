"""A real GRPOTrainer under torchrun with `attach(controller="knee")`, for
tests/integrations/test_update_gate.py:

    torchrun --nproc-per-node 2 -- controller_torchrun.py OUT STEPS

The toy trainer with 2 completions a process and micro-step and 3 micro-steps a step (a step's
12 rows are 3 groups of 4, one straddling the two processes), the split at every step, and a
rule that decides 2 base batches once it has pooled 2 records (`decide` patched in every
process: only the main process's decision may count). Each process writes, at every step's end,
the k of the update the step belongs to, whether the optimizer stepped, and a checksum of its
parameters: `OUT/rank{r}.json`; the main process TRL's log, `OUT/log_history.json`."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import torch
from transformers import TrainerCallback
from trl_toy import toy_trainer

from otb_diag.integrations.core import controller
from otb_diag.integrations.trl import attach
from otb_diag.runtime.torchrun import session


def scheduled(self: Any, knee: Any, current: int, records: int) -> int:
    return 2 * self.base if records >= 2 else current


def main(out: Path, steps: int) -> None:
    out.mkdir(parents=True, exist_ok=True)
    controller.KneeRule.decide = scheduled
    trainer = toy_trainer(out, steps, per_step=2, gradient_accumulation_steps=3)
    live = attach(trainer, controller="knee", split_every=1, metrics="all")
    rank = trainer.accelerator.process_index
    history: list[dict[str, Any]] = []

    class Record(TrainerCallback):
        def on_step_end(self, args: Any, state: Any, control: Any, **_: Any) -> None:
            gate = live.gate
            params = torch.cat([p.detach().flatten() for p in trainer.model.parameters()])
            # `on_step_end` runs after attach's own, which moved the gate to the next batch
            history.append(
                {"batches": gate.batches, "index": gate.index, "sum": float(params.double().sum())}
            )

    trainer.add_callback(Record())
    trainer.train()
    (out / f"rank{rank}.json").write_text(json.dumps(history))
    if trainer.accelerator.is_main_process:
        (out / "log_history.json").write_text(json.dumps(trainer.state.log_history))


if __name__ == "__main__":
    out, steps = sys.argv[1:]
    with session():
        main(Path(out), int(steps))
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # as trl_torchrun.py leaves: without the interpreter's gloo teardown
