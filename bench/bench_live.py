"""Overhead of `otb_diag.integrations.trl.attach` on a real TRL GRPOTrainer step, and its memory
over a run: on the CPU (the embedded checkpoint, tests/integrations/trl_toy.py's set-up) or, with
`--gpu`, on one CUDA device at a realistic shape.

    python bench/bench_live.py            # 3 rounds x 12 steps per configuration (~2 min)
    python bench/bench_live.py --quick    # 2 rounds x 8 steps
    python bench/bench_live.py --model medium   # the same on a larger random-weight body
    python bench/bench_live.py --gpu      # make bench-gpu's live row (~2 min on an H100)

`--model` picks the CPU policy: `toy` (the embedded checkpoint, a step of tens of ms, where the
diagnostics' fixed cost shows most: the stand-in for a GPU's launch-bound step) or `small` /
`medium`, a GPT-2 body of that size with seeded random weights and the embedded tokenizer (saved
to a temporary folder as safetensors), whose step's compute dominates as a real policy's does;
the rewards then rarely pay, which changes nothing the diagnostics compute. The CPU runs on
`--threads` torch threads (1 by default, set before any work: a launch-bound step on 2 threads
beside another job slowed 40-fold, issue 46).

`--gpu`: a GPT-2 body of 0.30 B parameters (`MODELS["gpu"]`, seeded random weights, the
embedded tokenizer), `bf16=True`, 16 prompts × 4 completions of up to 48 tokens a step, and
learning rate 0, so that every configuration does the same realistic work step after step (at
TRL's 1e-3 a random policy collapses to one-token completions after one step, issue 48).

Configurations, each a fresh trainer with the same seed: `plain` (no attach), `loss-logits`
(attach, Σπ² from the loss's own forward through TRL's fused head, no split), `extra-forward`
(one extra no-grad forward for Σπ² instead), `every-10` (loss logits, metrics every 10th step),
`split` (the split at every step, its head-mode scores from the loss forward's hidden states,
`integrations/trl/split_capture.py`), `default` (`attach(trainer)`: the split at every 10th
logged step) and `otb-advantages` (`attach(trainer, advantages="otb")`: training with OTB's
advantages, their W from `generate`'s own forwards, `integrations/core/generation_stats.py`).
`--gpu` runs `plain`, `default`, `split` and `otb-advantages`. A step's time is the wall time
between the trainer callbacks `on_step_begin` and `on_step_end` (the generation, the rewards,
the loss, the backward and the optimizer step); the first 2 steps of each run are warm-up.
Rounds alternate the configurations, and each configuration's figure is the median over all its
timed steps; the overhead is `median(attached) / median(plain) − 1`, against `TARGETS`.

Where the attached time goes, per step over all its steps, as wall time inside the hooks on the
training's critical path: `hand-over` (putting the batch together from the micro-steps and
handing it to the live core: `_start`, `_take`, which includes pickling it to the worker
process), `wait` (the step's end waiting for the worker's metrics) and `finish` (the collapse
watch, the pools, the controller, the full record and TRL's metric lists). On a loaded machine
the difference of two medians moves by ±15 % from run to run, these figures much less.

Memory: the live state `attach` keeps (the collapse watch's two deques of `window + 1` values,
the last step's metrics) is measured after the first and the last step of a longer run (CPU
only); it must not grow with the run. TRL's own `log_history` grows with every logged step either
way.

Output: the machine, a table, the targets' PASS/FAIL, then one JSON line with the same numbers.
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import platform
import shutil
import statistics
import sys
import tempfile
import time
import warnings
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "integrations"))

import torch  # noqa: E402
from threads import add_threads, pin_threads  # noqa: E402
from transformers import AutoConfig, AutoModelForCausalLM, TrainerCallback  # noqa: E402
from trl_toy import PROMPTS, toy_trainer  # noqa: E402

from otb_diag.integrations.core.live_core import LiveCore  # noqa: E402
from otb_diag.integrations.core.worker import Worker  # noqa: E402
from otb_diag.integrations.trl import LiveDiagnostics, attach  # noqa: E402
from otb_diag.io.scenarios import default_checkpoint  # noqa: E402

WARMUP = 2
# GPT-2 body sizes (the embedded checkpoint's is 128 wide, 3 layers; `toy` is the embedded
# checkpoint itself); `gpu` is --gpu's: 24 × 12 · 1024² ≈ 0.30 B parameters.
MODELS = {
    "toy": None,
    "small": {"n_embd": 256, "n_layer": 4, "n_head": 4},
    "medium": {"n_embd": 512, "n_layer": 8, "n_head": 8},
    "gpu": {"n_embd": 1024, "n_layer": 24, "n_head": 16, "n_positions": 256},
}
MODEL_SEED = 0
CONFIGS = {
    "plain": None,
    "loss-logits": {"split_every": None},
    "extra-forward": {"extra_forward": True, "split_every": None},
    "every-10": {"every": 10, "split_every": None},
    "split": {"split_every": 1},
    "default": {},
    "otb-advantages": {"advantages": "otb"},
}
GPU_CONFIGS = ("plain", "default", "split", "otb-advantages")
# The most each configuration may add to TRL's own step (issue 48): on the GPU, and on the
# CPU toy's launch-bound step, the GPU's stand-in.
TARGETS = {
    "gpu": {"default": 0.03, "split": 0.05, "otb-advantages": 0.05},
    "cpu": {"default": 0.10, "loss-logits": 0.05},
}
# --gpu's trainer: 16 prompts × 4 completions a step, of up to 48 tokens, bf16, learning rate 0
# (the toy's 8 prompts repeated: with random weights and no update, what they say is moot).
GPU_TRAINER = {
    "prompts": PROMPTS * 8,
    "per_step": 64,
    "max_completion_length": 48,
    "bf16": True,
    "use_cpu": False,
    "learning_rate": 0.0,
    "temperature": 1.0,
}


class StepTimer(TrainerCallback):
    def __init__(self) -> None:
        self.times: list[float] = []
        self._start = 0.0

    def on_step_begin(self, *args, **kwargs) -> None:
        self._start = time.perf_counter()

    def on_step_end(self, *args, **kwargs) -> None:
        self.times.append(time.perf_counter() - self._start)


# Where the hooks' time on the training's critical path goes (module docstring): each part, the
# functions timed for it. `wait` and `finish` run inside `collect`.
PARTS = {
    "hand-over": ((LiveDiagnostics, "_start"), (LiveDiagnostics, "_take")),
    "wait": ((Worker, "result"),),
    "finish": ((LiveCore, "finish"), (LiveDiagnostics, "_log")),
}
part_seconds: dict[str, float] = defaultdict(float)


def _timed(fn, part: str):
    def timed(*args, **kwargs):
        start = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            part_seconds[part] += time.perf_counter() - start

    return timed


for _part, _functions in PARTS.items():
    for _owner, _name in _functions:
        setattr(_owner, _name, _timed(getattr(_owner, _name), _part))


def random_checkpoint(folder: Path, size: dict[str, int]) -> Path:
    """A checkpoint in `folder`: the embedded one's GPT-2 config resized to `size`, seeded
    random weights (safetensors), the embedded tokenizer and generation config."""
    embedded = default_checkpoint()
    torch.manual_seed(MODEL_SEED)
    model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(embedded, **size))
    model.save_pretrained(folder)
    for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        shutil.copy(Path(embedded) / name, folder / name)
    return folder


def one_run(
    name: str, steps: int, folder: Path, ckpt: Path | None, trainer_options: dict
) -> tuple[list[float], object]:
    """The timed steps' durations (s) of one run on `ckpt` (None: the embedded one); the hooks'
    time accumulates in `part_seconds`."""
    trainer = toy_trainer(folder / name, steps, ckpt=ckpt, **trainer_options)
    live = attach(trainer, **CONFIGS[name]) if CONFIGS[name] is not None else None
    timer = StepTimer()
    trainer.add_callback(timer)
    trainer.train()
    if live is not None and not live.enabled:  # timing switched-off hooks would flatter them
        raise RuntimeError(f"{name}: the live diagnostics switched themselves off")
    return timer.times[WARMUP:], live


def count_parameters(ckpt: Path | None) -> int:
    """The policy's parameter count (`ckpt` None: the embedded checkpoint)."""
    model = AutoModelForCausalLM.from_pretrained(ckpt or default_checkpoint())
    return sum(p.numel() for p in model.parameters())


def live_state_bytes(live) -> int:
    """Bytes of what the live diagnostics keep between steps (pickled)."""
    watch = live.core.watch
    return len(pickle.dumps((list(watch.grad.values), list(watch.variance.values), live.last,
                             live._pending)))  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="2 rounds x 8 timed steps")
    parser.add_argument("--rounds", type=int, help="rounds per configuration (default 3)")
    parser.add_argument("--steps", type=int, help="timed steps per round (default 12; --gpu 5)")
    parser.add_argument("--model", choices=MODELS, default="toy", help="the CPU policy")
    add_threads(parser, 1)
    parser.add_argument("--gpu", action="store_true", help="the realistic GPU row (above)")
    parser.add_argument("--device", default="cuda", help=argparse.SUPPRESS)  # --gpu's smoke test
    args = parser.parse_args()
    rounds, steps = (2, 8) if args.quick else (3, 5 if args.gpu else 12)
    rounds, steps = args.rounds or rounds, args.steps or steps
    warnings.filterwarnings("ignore")
    kind = "gpu" if args.gpu else "cpu"
    if args.gpu:
        if args.device == "cuda" and not torch.cuda.is_available():
            sys.exit("bench_live.py --gpu: no CUDA device here.")
        names, size = GPU_CONFIGS, MODELS["gpu" if args.device == "cuda" else "small"]
        trainer_options = GPU_TRAINER | {"use_cpu": args.device != "cuda"}
        trainer_options["bf16"] = args.device == "cuda"
    else:
        print(pin_threads(args.threads))
        names, size, trainer_options = tuple(CONFIGS), MODELS[args.model], {}
    times: dict[str, list[float]] = {name: [] for name in names}
    parts: dict[str, dict[str, float]] = {name: dict.fromkeys(PARTS, 0.0) for name in names}
    memory = {}
    with tempfile.TemporaryDirectory() as tmp:
        ckpt = random_checkpoint(Path(tmp) / "model", size) if size else None
        model = {"name": "gpu" if args.gpu else args.model, "parameters": count_parameters(ckpt)}
        for _ in range(rounds):
            for name in names:
                part_seconds.clear()
                times[name] += one_run(name, steps + WARMUP, Path(tmp), ckpt, trainer_options)[0]
                for part in PARTS:
                    parts[name][part] += part_seconds[part] / (steps + WARMUP) / rounds
        if not args.gpu:  # the live state after a short and a long run
            _, short = one_run("loss-logits", 3, Path(tmp) / "short", ckpt, trainer_options)
            _, long = one_run("loss-logits", 3 * steps, Path(tmp) / "long", ckpt, trainer_options)
            memory = {
                "after_3_steps": live_state_bytes(short),
                f"after_{3 * steps}_steps": live_state_bytes(long),
            }
    median = {name: statistics.median(t) for name, t in times.items()}
    overhead = {name: median[name] / median["plain"] - 1 for name in names if name != "plain"}
    machine = {
        "device": torch.cuda.get_device_name() if args.gpu and args.device == "cuda" else "cpu",
        "cores": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "load_average_1min": os.getloadavg()[0],
        "python": platform.python_version(),
        "torch": torch.__version__,
    }
    print(f"machine: {machine}")
    print(f"model: {model}; {rounds} rounds x {steps} timed steps a configuration")
    print(
        f"{'configuration':<15}{'median step (ms)':>17}{'overhead':>10}"
        + "".join(f"{part + ' (ms)':>16}" for part in PARTS)
        + f"{'steps':>7}"
    )
    for name in names:
        extra = f"{overhead[name]:+.1%}" if name in overhead else "—"
        cells = "".join(f"{1e3 * parts[name][part]:>16.2f}" for part in PARTS)
        print(f"{name:<15}{1e3 * median[name]:>17.1f}{extra:>10}{cells}{len(times[name]):>7}")
    verdicts = {
        name: {"at_most": most, "pass": overhead[name] <= most}
        for name, most in TARGETS[kind].items()
        if name in overhead
    }
    for name, v in verdicts.items():
        print(f"target: {name} ≤ {v['at_most']:.0%}: {'PASS' if v['pass'] else 'FAIL'}")
    if memory:
        print(f"live state kept between steps (bytes): {memory}")
    record = {"machine": machine, "model": model, "median_step_s": median, "overhead": overhead}
    record |= {"hooks_s_per_step": parts, "targets": verdicts, "live_state_bytes": memory}
    print(json.dumps(record))


if __name__ == "__main__":
    main()
