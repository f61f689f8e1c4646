"""Real GRPOTrainer and RLOOTrainer trainings under torchrun with `attach`, for
tests/integrations/test_trl_processes.py, one after the other in one launch (each process
starts once: torch, transformers and TRL's imports are most of a launch):

    torchrun --nproc-per-node 2 -- trl_torchrun.py OUT PER_STEP ACCUMULATION STEPS RUN...

Each RUN is a trainer (`GRPOTrainer`, `RLOOTrainer`), optionally with a planted failure
(`GRPOTrainer:fail`, `FAILS`), and trains into `OUT/RUN` (`:` as `-`): `trl_toy.toy_trainer`
with `PER_STEP` completions a process and micro-step and `ACCUMULATION` micro-steps a step (so a
step's generation batch holds PER_STEP · ACCUMULATION rows a process, and a group of
`trl_toy.GENERATIONS` can straddle two processes), the split at every step and a checkpoint
after each. Each process writes the rows it generated at each step,
`OUT/RUN/rank{r}-step{s}.json` (completion ids and mask, as `_generate_and_score_completions`
returned them), what the run wrote to its stderr, `OUT/RUN/stderr.rank{r}` (the live
diagnostics' warnings), and the main process TRL's log, `OUT/RUN/log_history.json`. With a
failure, one of `attach`'s functions raises on the last process, from the step it names on (as
a forward that runs out of memory there would): with `fail`, reading the step's rows at its
gather (step 1 on); with `fail-start-S`, forming the process's rewards as the step's batch is
generated (`LiveDiagnostics._start`, step S on, before any micro-step trains on it); the
function is restored after the run. A failing split alone switches off the split alone
(tests/integrations/test_trl_precision.py)."""

from __future__ import annotations

import contextlib
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
# A failure's prefix (the longer first: `fail` begins both) and the function of trl/adapter.py
# it makes raise.
FAILS = {"fail-start-": "local_rewards", "fail": "rows_of"}


def folder(out: Path, run: str) -> Path:
    """Where RUN trains: `OUT/GRPOTrainer`, `OUT/GRPOTrainer-fail`."""
    return out / run.replace(":", "-")


@contextlib.contextmanager
def planted(fail: str | None, trainer: Any, rank: int) -> Any:
    """Within: `fail`'s function of trl/adapter.py raises on the last process from its step on."""
    if fail is None or rank != trainer.accelerator.num_processes - 1:
        yield
        return
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
    try:
        yield
    finally:
        setattr(trl_integration, name, original)


def main(out: Path, per_step: int, accumulation: int, steps: int, run: str) -> None:
    trainer_name, _, fail = run.partition(":")
    rloo = trainer_name == "RLOOTrainer"
    out = folder(out, run)
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
    generate = trainer._generate_and_score_completions

    def recording(inputs: Any) -> dict[str, Any]:
        output = generate(inputs)
        if trainer.model.training:
            step = trainer.state.global_step + 1
            rows = {k: output[k].tolist() for k in ("completion_ids", "completion_mask")}
            (out / f"rank{rank}-step{step}.json").write_text(json.dumps(rows))
        return output

    trainer._generate_and_score_completions = recording
    with (
        (out / f"stderr.rank{rank}").open("w") as err,
        contextlib.redirect_stderr(err),
        planted(fail or None, trainer, rank),
    ):
        trainer.train()
    if trainer.accelerator.is_main_process:
        (out / "log_history.json").write_text(json.dumps(trainer.state.log_history))


if __name__ == "__main__":
    out, per_step, accumulation, steps, *runs = sys.argv[1:]
    # The library's join and leave (the group accelerate finds and uses): the model stack imported
    # before the group exists, a barrier before it goes (runtime/torchrun.py:session).
    with session():
        for run in runs:
            main(Path(out), int(per_step), int(accumulation), int(steps), run)
    # Everything is written and the group is left. After a failing run, a rank sometimes aborted
    # in the interpreter's teardown ("terminate called without an active exception", a C++ thread
    # still joinable; 2 of 8 launches beside a busy core): a known gloo teardown abort, not yet
    # traced to what keeps that thread (docs/live.md). Leave without the teardown.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
