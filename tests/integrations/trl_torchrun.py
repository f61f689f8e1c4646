"""A real GRPOTrainer (or RLOOTrainer) under torchrun with `attach`, for
tests/integrations/test_trl_processes.py:

    torchrun --nproc-per-node 2 -- trl_torchrun.py OUT PER_STEP ACCUMULATION STEPS [FAIL] TRAINER...

For each TRAINER (`GRPOTrainer`, `RLOOTrainer`), one after the other in one session (each
process starts once), a training into `OUT/TRAINER`: `trl_toy.toy_trainer` with `PER_STEP`
completions a process and micro-step and `ACCUMULATION` micro-steps a step (so a step's
generation batch holds PER_STEP · ACCUMULATION rows a process, and a group of
`trl_toy.GENERATIONS` can straddle two processes), the split at every step and a checkpoint
after each. Each process writes the rows it generated at each step,
`OUT/TRAINER/rank{r}-step{s}.json` (completion ids and mask, as
`_generate_and_score_completions` returned them), and the main process TRL's log,
`OUT/TRAINER/log_history.json`. With a FAIL (`FAILS`), one of `attach`'s functions raises on the
last process, from the step FAIL names on (as a forward that runs out of memory there would): with
`fail`, reading the step's rows at its gather (step 1 on); with `fail-start-S`, forming the
process's rewards as the step's batch is generated (`LiveDiagnostics._start`, step S on, before
any micro-step trains on it). A failing split alone switches off the split alone
(tests/integrations/test_trl_precision.py)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

from trl_toy import toy_trainer

from otb_diag.integrations.trl import adapter as trl_integration
from otb_diag.integrations.trl import attach
from otb_diag.runtime.torchrun import session

SPLIT_K = 16
# A FAIL argument's prefix (the longer first: `fail` begins both) and the function of trl/adapter.py
# it makes raise.
FAILS = {"fail-start-": "local_rewards", "fail": "rows_of"}


def main(
    out: Path, per_step: int, accumulation: int, steps: int, rloo: bool, fail: str | None
) -> None:
    out.mkdir(parents=True, exist_ok=True)
    config = {"beta": 0.0} if rloo else {}
    trainer = toy_trainer(
        out,
        steps,
        per_step=per_step,
        rloo=rloo,
        gradient_accumulation_steps=accumulation,
        save_strategy="steps",
        save_steps=1,
        save_only_model=True,
        **config,
    )
    attach(trainer, dump_dir=out / "otb", split_every=1, split_k=SPLIT_K, metrics="all")
    rank = trainer.accelerator.process_index
    if fail is not None and rank == trainer.accelerator.num_processes - 1:
        prefix = next(p for p in FAILS if fail.startswith(p))
        name = FAILS[prefix]
        first = int(fail.removeprefix(prefix) or 1)  # the first step it raises at
        original = getattr(trl_integration, name)

        def out_of_memory(*args: Any) -> Any:
            step = trainer.state.global_step + 1
            if step >= first:
                raise RuntimeError(f"planted on process {rank} at step {step}")
            return original(*args)

        setattr(trl_integration, name, out_of_memory)
    generate = trainer._generate_and_score_completions

    def recording(inputs: Any) -> dict[str, Any]:
        output = generate(inputs)
        if trainer.model.training:
            step = trainer.state.global_step + 1
            rows = {k: output[k].tolist() for k in ("completion_ids", "completion_mask")}
            (out / f"rank{rank}-step{step}.json").write_text(json.dumps(rows))
        return output

    trainer._generate_and_score_completions = recording
    trainer.train()
    if trainer.accelerator.is_main_process:
        (out / "log_history.json").write_text(json.dumps(trainer.state.log_history))


if __name__ == "__main__":
    out, per_step, accumulation, steps, *trainers = sys.argv[1:]
    fail = trainers[0] if trainers[0].startswith(tuple(FAILS)) else None
    # The library's join and leave (the group accelerate finds and uses): the model stack imported
    # before the group exists, a barrier before it goes (runtime/torchrun.py:session).
    with session():
        for trainer in trainers[fail is not None :]:
            rloo = trainer == "RLOOTrainer"
            main(Path(out) / trainer, int(per_step), int(accumulation), int(steps), rloo, fail)
    # Everything is written and the group is left. With `fail`, a rank sometimes aborted in the
    # interpreter's teardown ("terminate called without an active exception", a C++ thread still
    # joinable; 2 of 8 launches beside a busy core): a known gloo teardown abort, not yet traced
    # to what keeps that thread (docs/live.md). Leave without the teardown.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
