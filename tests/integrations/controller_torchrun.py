"""A real GRPOTrainer under torchrun with `attach(controller="knee")`, for
tests/integrations/test_update_gate.py and tests/integrations/test_trl_sharded.py:

    torchrun --nproc-per-node 2 -- controller_torchrun.py OUT STEPS [zero3]

The toy trainer with 2 completions a process and micro-step and 3 micro-steps a step (a step's
12 rows are 3 groups of 4, one straddling the two processes), the split at every step, and a
rule that decides 2 base batches once it has pooled 2 records (`decide` patched in every
process: only the main process's decision may count). Under DDP, or with `zero3` under
DeepSpeed ZeRO-3 (`ZERO3`: the same seeds, so the same run to float round-off; tests/integrations/
test_trl_sharded.py sets the two side by side). Each process writes, at every step's end, the k
of the update the step belongs to, whether the optimizer stepped, and a checksum of its
parameters (gathered whole under ZeRO-3): `OUT/rank{r}.json`; the warnings raised while it
trained and the parameter elements it held itself: `OUT/rank{r}-run.json`; the main process
TRL's log, `OUT/log_history.json`.

Then, in the same launch (each process and DeepSpeed start once), the trainings of `BESIDE`, 2
steps each, 8 completions a process and step (2 whole groups, 2 micro-steps of 4) with a
default `attach` but for its `advantages`: `lora-otb`, a LoRA policy trained with
`advantages="otb"` at τ = 2 (its completions' lengths differ between the processes, so that a
process's `generate` runs past its own last token under ZeRO-3's `synced_gpus`); `rloo`, an
`RLOOTrainer` at its defaults (β = 0.05: a reference model, its KL in the rewards). Each process
writes, for each step, its generated completion ids and the advantages that trained, and the
parameter elements it held: `OUT/NAME/rank{r}.json`; the main process TRL's log,
`OUT/NAME/log_history.json`, beside attach's own `OUT/NAME/otb_metrics.jsonl`."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import torch
from transformers import TrainerCallback
from trl_toy import toy_trainer

from otb_diag.integrations.core import controller
from otb_diag.integrations.trl import attach
from otb_diag.runtime.torchrun import session

# ZeRO-3 on the CPU: `stage3_param_persistence_threshold` 0 partitions the toy's small tensors
# too (at DeepSpeed's default of 1e5 elements none of them would be); the rest as TRL's trainer
# fills it in ("auto") from its own arguments.
ZERO3 = {
    "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0},
    "zero_allow_untested_optimizer": True,  # TRL's AdamW
    "train_micro_batch_size_per_gpu": "auto",
    "gradient_accumulation_steps": "auto",
    "train_batch_size": "auto",
    "gradient_clipping": "auto",
    "bf16": {"enabled": False},
    "fp16": {"enabled": False},
}


def without_shm_build() -> None:
    """DeepSpeed's CPU accelerator (gloo: oneCCL is not installed), without the JIT build of
    its shared-memory all-reduce (`deepspeed_shm_comm`: g++ and ninja, ~100 s on a first
    launch), which serves only `inference_all_reduce`, never ZeRO-3's training. DeepSpeed
    probes once a process which ops can be built and keeps the answer in `deepspeed.ops`."""
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    import deepspeed.ops

    deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False


def whole(params: list[torch.nn.Parameter], zero3: bool) -> Any:
    """A context in which `params` are whole on this process (gathered under ZeRO-3)."""
    if not zero3:
        return contextlib.nullcontext()
    import deepspeed

    return deepspeed.zero.GatheredParameters(params, modifier_rank=None)


STEPS = 6  # the tests' run: k = 1 for steps 1 and 2, then updates of steps 3-4 and 5-6


def gated(factory: Any, mode: str = "ddp") -> tuple[Path, subprocess.CompletedProcess]:
    """This script's run of `STEPS` under DDP (`mode` "ddp") or ZeRO-3 ("zero3") on 2
    processes, once a pytest session (`launch.launched_once`): its folder and its launch."""
    from launch import launched_once

    args = (STEPS,) if mode == "ddp" else (STEPS, mode)
    return launched_once(factory, f"gated-{mode}", 2, *args, script=Path(__file__))


def scheduled(self: Any, knee: Any, current: int, records: int) -> int:
    return 2 * self.base if records >= 2 else current


def main(out: Path, steps: int, zero3: bool) -> None:
    out.mkdir(parents=True, exist_ok=True)
    controller.KneeRule.decide = scheduled
    config = {"deepspeed": ZERO3} if zero3 else {}
    trainer = toy_trainer(out, steps, per_step=2, gradient_accumulation_steps=3, **config)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        live = attach(trainer, controller="knee", split_every=1, metrics="all")
        rank = trainer.accelerator.process_index
        history: list[dict[str, Any]] = []

        class Record(TrainerCallback):
            def on_step_end(self, args: Any, state: Any, control: Any, **_: Any) -> None:
                gate = live.gate
                own = list(trainer.model.parameters())
                with whole(own, zero3):  # every process: a collective under ZeRO-3
                    params = torch.cat([p.detach().flatten() for p in own])
                # `on_step_end` runs after attach's own, which moved the gate to the next batch
                history.append(
                    {
                        "batches": gate.batches,
                        "index": gate.index,
                        "sum": float(params.double().sum()),
                    }
                )

        trainer.add_callback(Record())
        trainer.train()
    (out / f"rank{rank}.json").write_text(json.dumps(history))
    held = sum(p.numel() for p in trainer.model.parameters())  # this process's own elements
    said = [f"{w.category.__name__}: {w.message}" for w in caught]
    (out / f"rank{rank}-run.json").write_text(json.dumps({"warnings": said, "held": held}))
    if trainer.accelerator.is_main_process:
        (out / "log_history.json").write_text(json.dumps(trainer.state.log_history))


# The trainings beside the gated one: their toy's settings and attach's (module docstring).
BESIDE = {
    "lora-otb": ({"lora": ["c_attn"], "temperature": 2.0}, {"advantages": "otb"}),
    "rloo": ({"rloo": True}, {}),
}


def beside(out: Path, name: str, zero3: bool) -> None:
    """The training `name` of `BESIDE` into `out/name` (module docstring)."""
    settings, options = BESIDE[name]
    settings = dict(settings)
    if "lora" in settings:
        from peft import LoraConfig

        settings["peft_config"] = LoraConfig(r=4, target_modules=settings.pop("lora"))
    if zero3:
        # A CPU run's accelerate leaves DeepSpeed's communicator to the engine (on a GPU its
        # state starts it); RLOO's reference model is built under `zero.Init`, before any.
        import deepspeed.comm

        deepspeed.comm.init_distributed(dist_backend="gloo", auto_mpi_discovery=False)
        settings["deepspeed"] = ZERO3
    trainer = toy_trainer(out / name, 2, per_step=4, gradient_accumulation_steps=2, **settings)
    attach(trainer, **options)
    steps: list[dict[str, Any]] = []
    generate = trainer._generate_and_score_completions

    def recording(inputs: Any) -> dict[str, Any]:
        output = generate(inputs)  # attach's: the advantages that train
        if trainer.model.training:
            steps.append({k: output[k].tolist() for k in ("completion_ids", "advantages")})
        return output

    trainer._generate_and_score_completions = recording
    trainer.train()
    held = sum(p.numel() for p in trainer.model.parameters())
    rank = trainer.accelerator.process_index
    (out / name / f"rank{rank}.json").write_text(json.dumps({"steps": steps, "held": held}))
    if trainer.accelerator.is_main_process:
        (out / name / "log_history.json").write_text(json.dumps(trainer.state.log_history))


if __name__ == "__main__":
    out, steps, *mode = sys.argv[1:]
    zero3 = mode == ["zero3"]
    if zero3:
        without_shm_build()
    with session():
        main(Path(out), int(steps), zero3)
        for name in BESIDE:
            beside(Path(out), name, zero3)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # as trl_torchrun.py leaves: without the interpreter's gloo teardown
