"""Overhead of `otb_diag.integrations.trl.attach` on a real TRL GRPOTrainer step (CPU, the
embedded checkpoint, tests/integrations/trl_toy.py's set-up), and its memory over a run.

    python bench/bench_live.py            # 3 rounds x 12 steps per configuration (~2 min)
    python bench/bench_live.py --quick    # 2 rounds x 8 steps
    python bench/bench_live.py --model medium   # the same on a larger random-weight body

`--model` picks the policy: `toy` (the embedded checkpoint, a step of tens of ms, where the
diagnostics' fixed cost shows most) or `small` / `medium`, a GPT-2 body of that size with seeded
random weights and the embedded tokenizer (saved to a temporary folder as safetensors), whose
step's compute dominates as a real policy's does; the rewards then rarely pay, which changes
nothing the diagnostics compute.

Configurations, each a fresh trainer with the same seed: `plain` (no attach), `loss-logits`
(attach, Σπ² from the loss's own forward through TRL's fused head), `extra-forward` (attach with
one extra no-grad forward for Σπ²), `every-10` (loss logits, metrics every 10th step), all three
without the within/between split (`split_every=None`); then with it, on the loss's logits:
`split` (the split at every step, its head-mode scores from the loss forward's hidden states,
`integrations/trl/split_capture.py`) and `split-every-10` (attach's default, the split at every
10th logged step); and `otb-advantages`, `attach(trainer, advantages="otb")` with its defaults:
training with OTB's advantages, their W from `generate`'s own forwards
(`integrations/core/generation_stats.py`), the split at every 10th step. A step's
time is the wall time between the trainer callbacks `on_step_begin` and `on_step_end` (the
generation, the rewards, the loss, the backward and the optimizer step); the first 2 steps of
each run are warm-up. Rounds alternate the configurations, and each configuration's figure is
the median over all its timed steps; the overhead is `median(attached) / median(plain) − 1`.
Beside it, the time spent inside the hooks on the training's critical path (putting the batch
together, waiting for the worker thread's tables at the step's end), per step over all steps,
as a share of the plain median step: on a loaded machine the difference of two medians moves
by ±15 % from run to run, this figure much less.

Memory: the live state `attach` keeps (the collapse watch's two deques of `window + 1` values,
the last step's metrics) is measured after the first and the last step of a longer run; it must
not grow with the run. TRL's own `log_history` grows with every logged step either way.

Output: a table, then one JSON line with the same numbers.
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
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "integrations"))

import torch  # noqa: E402
from transformers import AutoConfig, AutoModelForCausalLM, TrainerCallback  # noqa: E402
from trl_toy import toy_trainer  # noqa: E402

from otb_diag.integrations.trl import LiveDiagnostics, attach  # noqa: E402
from otb_diag.io.scenarios import default_checkpoint  # noqa: E402

WARMUP = 2
TARGET = 0.05  # ≤ 5 % of a step with the loss's logits
# GPT-2 body sizes for `--model` (the embedded checkpoint's is 128 wide, 3 layers); `toy` is the
# embedded checkpoint itself.
MODELS = {
    "toy": None,
    "small": {"n_embd": 256, "n_layer": 4, "n_head": 4},
    "medium": {"n_embd": 512, "n_layer": 8, "n_head": 8},
}
MODEL_SEED = 0


class StepTimer(TrainerCallback):
    def __init__(self) -> None:
        self.times: list[float] = []
        self._start = 0.0

    def on_step_begin(self, *args, **kwargs) -> None:
        self._start = time.perf_counter()

    def on_step_end(self, *args, **kwargs) -> None:
        self.times.append(time.perf_counter() - self._start)


# The hooks that run on the training's critical path: the batch put together (`_start`,
# `_take`, which includes `_finish` and the split's head-mode scores), and the wait for the
# worker thread's tables (`collect`).
HOOKS = ("_start", "_take", "collect")
hook_seconds = [0.0]


def _timed(fn):
    def timed(*args, **kwargs):
        start = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            hook_seconds[0] += time.perf_counter() - start

    return timed


for _hook in HOOKS:
    setattr(LiveDiagnostics, _hook, _timed(getattr(LiveDiagnostics, _hook)))

CONFIGS = {
    "plain": None,
    "loss-logits": {"split_every": None},
    "extra-forward": {"extra_forward": True, "split_every": None},
    "every-10": {"every": 10, "split_every": None},
    "split": {"split_every": 1},
    "split-every-10": {"split_every": 10},
    "otb-advantages": {"advantages": "otb"},
}


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
    name: str, steps: int, folder: Path, ckpt: Path | None = None
) -> tuple[list[float], object]:
    """The timed steps' durations (s) of one run on `ckpt` (default: the embedded one); the
    hooks' time accumulates in `hook_seconds`."""
    trainer = toy_trainer(folder / name, steps, ckpt=ckpt)
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
    parser.add_argument("--steps", type=int, help="timed steps per round (default 12)")
    parser.add_argument("--model", choices=MODELS, default="toy", help="the policy (see above)")
    args = parser.parse_args()
    rounds, steps = (2, 8) if args.quick else (3, 12)
    rounds, steps = args.rounds or rounds, args.steps or steps
    warnings.filterwarnings("ignore")
    times: dict[str, list[float]] = {name: [] for name in CONFIGS}
    hooks: dict[str, float] = dict.fromkeys(CONFIGS, 0.0)
    with tempfile.TemporaryDirectory() as tmp:
        size = MODELS[args.model]
        ckpt = random_checkpoint(Path(tmp) / "model", size) if size else None
        model = {"name": args.model, "parameters": count_parameters(ckpt)}
        for _ in range(rounds):
            for name in CONFIGS:
                hook_seconds[0] = 0.0
                times[name] += one_run(name, steps + WARMUP, Path(tmp), ckpt)[0]
                hooks[name] += hook_seconds[0] / (steps + WARMUP) / rounds
        # Memory: the live state after a short and a long run.
        _, short = one_run("loss-logits", 3, Path(tmp) / "short", ckpt)
        _, long = one_run("loss-logits", 3 * steps, Path(tmp) / "long", ckpt)
        memory = {
            "after_3_steps": live_state_bytes(short),
            f"after_{3 * steps}_steps": live_state_bytes(long),
        }
    median = {name: statistics.median(t) for name, t in times.items()}
    overhead = {name: median[name] / median["plain"] - 1 for name in CONFIGS if name != "plain"}
    # The hooks' own time on the critical path, per step, over the plain step: steadier than
    # the difference of medians on a loaded machine.
    hook_share = {name: hooks[name] / median["plain"] for name in CONFIGS if name != "plain"}
    machine = {
        "cores": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "load_average_1min": os.getloadavg()[0],
        "python": platform.python_version(),
        "torch": torch.__version__,
    }
    print(f"machine: {machine}")
    print(f"model: {model}")
    print(
        f"{'configuration':<15}{'median step (ms)':>18}{'overhead':>10}"
        f"{'hooks (ms/step)':>17}{'hooks/step':>12}{'steps':>7}"
    )
    for name in CONFIGS:
        extra = f"{overhead[name]:+.1%}" if name in overhead else "—"
        share = f"{hook_share[name]:.1%}" if name in hook_share else "—"
        print(
            f"{name:<15}{1e3 * median[name]:>18.1f}{extra:>10}"
            f"{1e3 * hooks[name]:>17.1f}{share:>12}{len(times[name]):>7}"
        )
    verdict = "PASS" if overhead["loss-logits"] <= TARGET else "FAIL"
    print(f"target: loss-logits overhead ≤ {TARGET:.0%}: {verdict}")
    print(f"live state kept between steps (bytes): {memory}")
    record = {"machine": machine, "model": model, "median_step_s": median, "overhead": overhead}
    record |= {"hooks_s_per_step": hooks, "hooks_share_of_plain_step": hook_share}
    print(json.dumps({**record, "target": TARGET, "verdict": verdict, "live_state_bytes": memory}))


if __name__ == "__main__":
    main()
