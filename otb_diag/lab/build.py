"""Rebuild the whole toy lab from a seed: train, save checkpoints, evaluate, sample rollouts.

Everything goes through the code path real checkpoints take: checkpoints are written with
``save_pretrained`` and read back with ``AutoModelForCausalLM`` / ``AutoTokenizer.from_pretrained``
before they are evaluated or sampled. Same seed, same machine: byte-identical rollout files and
identical weights (seeded numpy and torch RNGs, deterministic algorithms, a fixed thread count).

Output layout::

    out/checkpoints/checkpoint-<step>/   config.json, generation_config.json, model.safetensors,
                                         tokenizer.json, tokenizer_config.json
    out/rollouts.jsonl                   groups sampled from the final checkpoint
    out/rollouts_tir.jsonl               tool-use groups (rows carry a `mask`; scenarios with TIR
                                         prompts only)
    out/lab.json                         seed, config, sizes, pass rates, timings
"""

from __future__ import annotations

import contextlib
import dataclasses
import shutil
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)

from otb_diag.io.atomic import write_json, write_jsonl
from otb_diag.io.checkpoint import no_transformers_progress_bars
from otb_diag.io.scenarios import SCENARIOS as SCENARIO_NAMES
from otb_diag.lab.model import build_model, n_params
from otb_diag.lab.rollouts import (
    rollout_rows,
    sample_groups,
    sample_responses,
    sample_tool_responses,
)
from otb_diag.lab.sft import train
from otb_diag.lab.task import (
    MAX_DIGITS,
    MIN_DIGITS,
    PLAIN_OPS,
    SUM_OP,
    TOOL_OP,
    make_problem,
    parse_prompt,
    verify,
)
from otb_diag.lab.tokenizer import ALPHABET, LONG_ALPHABET, build_tokenizer
from otb_diag.runtime.threads import torch_threads


@dataclass(frozen=True)
class LabConfig:
    """Every knob of the lab build; the defaults build the shipped lab.

    Rollout prompts are (op, digit count) pairs; the digits are drawn from the seed. They were
    chosen from the final checkpoint's held-out pass rates (lab.json) so that most groups have
    mixed rewards. The shipped model (seed 0, step 1200) solves 3-digit problems 70-95 % of the
    time, 5-digit ones 20-75 % (reverse hardest, sort easiest), 8-digit sort about 30 % and
    nothing beyond about 12 digits. So 14 prompts sit on that slope (3 to 10 digits) and two
    long ones (sort 20, copy 36) stretch the response lengths past 8x; those two fail in every
    sample (13 of the 16 shipped groups are mixed). The TIR prompts (op T) follow the same idea.
    """

    ops: tuple[str, ...] = (*PLAIN_OPS, TOOL_OP)  # what the SFT data and the evaluation cover
    train_digits: tuple[int, int] = (MIN_DIGITS, MAX_DIGITS)
    curriculum: tuple[int, float] | None = None  # (first ceiling, fraction): `digit_ceiling`
    alphabet: str = ALPHABET
    n_embd: int = 128
    n_layer: int = 3
    n_head: int = 4
    n_positions: int = 160  # prompt (<= 43) + max_new_tokens (TIR: <= 112)
    steps: int = 1200
    save_steps: tuple[int, ...] = (300, 600, 900, 1200)
    batch_tokens: int = 2048  # prompt + answer tokens per training batch
    lr: float = 2e-3
    warmup: int = 50
    eval_digits: tuple[int, ...] = (3, 5, 8, 12, 17, 24, 32, 40)
    eval_per_cell: int = 16  # problems per (op, digit count) in the held-out pass rate
    rollout_prompts: tuple[tuple[str, int], ...] = (
        ("C", 3), ("R", 3), ("S", 3), ("C", 4), ("R", 4), ("S", 4), ("C", 5), ("R", 5),
        ("S", 5), ("S", 6), ("S", 7), ("S", 8), ("S", 9), ("S", 10), ("S", 20), ("C", 36),
    )  # fmt: skip
    group_size: int = 32
    tir_digits: tuple[int, ...] = (3, 4, 5, 6, 7, 8, 9, 20)
    tir_group_size: int = 16
    temperature: float = 1.0
    max_new_tokens: int = 64
    tir_max_new_tokens: int = 112
    threads: int = 2


LONG = LabConfig(
    ops=(SUM_OP,),
    train_digits=(3, 52),
    alphabet=LONG_ALPHABET,
    n_embd=128,
    n_layer=4,
    n_head=4,
    n_positions=512,  # prompt (<= 107) + max_new_tokens
    curriculum=(8, 0.6),
    steps=3000,
    save_steps=(1500, 3000),
    batch_tokens=2048,
    lr=2e-3,
    warmup=100,
    eval_digits=(3, 6, 10, 16, 24, 32, 42, 52),
    eval_per_cell=16,
    rollout_prompts=tuple(
        (SUM_OP, n) for n in (3, 4, 5, 6, 8, 10, 12, 14, 17, 20, 24, 28, 33, 38, 45, 52)
    ),
    group_size=128,
    tir_digits=(),
    max_new_tokens=400,
    threads=1,
)
"""The long scenario (issue 14): op A, a written running sum of 3 to 52 digits, so correct
responses take 20 to about 370 tokens; a 4-layer model; 16 prompts x 128 responses.

The curriculum (largest digit count 8 at first, all 52 from 60 % of the steps on) is what made
the model learn the lines: without it, 1,400 steps (and 1,600 more) left every scratchpad wrong
beyond a few digits; with it, 3,000 steps solve 3-digit sums almost always and 10-digit ones
about two times in three, and fail past about 14 digits (lab.json), so the groups' pass rates
fall with the length. One thread: the build is deterministic for a fixed count, and a second
thread buys little for a model this small (and costs much when the cores are shared)."""

# Keyed by the names `io/scenarios.py` knows (where each is shipped); zip fails on a mismatch.
SCENARIOS = dict(zip(SCENARIO_NAMES, (LabConfig(), LONG), strict=True))


@contextlib.contextmanager
def _build_environment(threads: int) -> Iterator[None]:
    """Fixed thread count, deterministic kernels and no per-file transformers progress bars
    (the build has its own) for the build; all restored afterwards."""
    old_deterministic = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        with torch_threads(threads), no_transformers_progress_bars():
            yield
    finally:
        torch.use_deterministic_algorithms(old_deterministic)


def _evaluate(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    rng: np.random.Generator,
    config: LabConfig,
) -> dict[str, dict[str, float]]:
    """Held-out pass rate per op and digit count: one sampled response (at the rollout
    temperature, op T with its tool) for each of `eval_per_cell` fresh problems.

    Returns ``{op: {digit count: rate}}``. Problems of one digit count share a prompt length, so
    they form one batch per sampler (ops of `config.ops`; op T through the tool sampler).
    """
    rates: dict[str, dict[str, float]] = {op: {} for op in config.ops}
    plain_ops = [op for op in config.ops if op != TOOL_OP]
    for n_digits in config.eval_digits:
        plain = [
            make_problem(rng, op, n_digits).prompt
            for op in plain_ops
            for _ in range(config.eval_per_cell)
        ]
        tool = [
            make_problem(rng, TOOL_OP, n_digits).prompt
            for _ in range(config.eval_per_cell if TOOL_OP in config.ops else 0)
        ]
        responses = sample_responses(
            model, tokenizer, plain,
            temperature=config.temperature, max_new_tokens=config.max_new_tokens,
        )  # fmt: skip
        responses += [
            ids
            for ids, _ in sample_tool_responses(
                model,
                tokenizer,
                tool,
                temperature=config.temperature,
                max_new_tokens=config.tir_max_new_tokens,
            )  # fmt: skip
        ]
        results: dict[str, list[float]] = {op: [] for op in rates}
        for prompt, ids in zip(plain + tool, responses, strict=True):
            results[parse_prompt(prompt).op].append(verify(prompt, tokenizer.decode(ids)))
        for op, rewards in results.items():
            rates[op][str(n_digits)] = float(np.mean(rewards))
    return rates


def _group_stats(rows: list[dict]) -> dict:
    """Size, length spread and reward mix of a rollouts file: what makes it a useful default."""
    lengths = [len(r["response_ids"]) for r in rows]
    groups: dict[str, list[float]] = {}
    for r in rows:
        groups.setdefault(r["group"], []).append(r["reward"])
    mixed = sum(0.0 < float(np.mean(g)) < 1.0 for g in groups.values())
    return {
        "rows": len(rows),
        "groups": len(groups),
        "mixed_groups": mixed,
        "mean_reward": float(np.mean([r["reward"] for r in rows])),
        "response_tokens": {
            "min": min(lengths),
            "median": float(np.median(lengths)),
            "max": max(lengths),
        },
    }


def build_lab(
    out_dir: Path, seed: int, config: LabConfig | None = None, progress: bool = True
) -> dict:
    """Train the lab model, save its checkpoints and sample the rollout files into `out_dir`.

    Stale `checkpoint-*` directories under `out_dir/checkpoints` are removed first, so the
    directory always describes one run. Returns the summary also written to `out_dir/lab.json`.
    """
    config = config or LabConfig()
    out_dir = Path(out_dir)
    ckpt_root = out_dir / "checkpoints"
    ckpt_root.mkdir(parents=True, exist_ok=True)
    for stale in ckpt_root.glob("checkpoint-*"):
        shutil.rmtree(stale)
    # Independent streams, so e.g. changing the eval size leaves the rollout prompts unchanged.
    train_rng, eval_rng, prompt_rng = (
        np.random.default_rng(s) for s in np.random.SeedSequence(seed).spawn(3)
    )
    n_groups = len(config.rollout_prompts) + len(config.tir_digits)
    timings: dict[str, float] = {}
    start = time.perf_counter()
    with (
        _build_environment(config.threads),
        tqdm(
            total=config.steps + len(config.save_steps) + n_groups,
            desc="lab build",
            disable=not progress,
        ) as bar,
    ):
        torch.manual_seed(seed)
        tokenizer = build_tokenizer(config.alphabet)
        model = build_model(
            tokenizer, config.n_embd, config.n_layer, config.n_head, config.n_positions
        )
        losses = train(model, tokenizer, train_rng, config, ckpt_root, bar)
        timings["train_s"] = time.perf_counter() - start

        checkpoints = []
        for step in sorted(config.save_steps):
            path = ckpt_root / f"checkpoint-{step}"
            model = AutoModelForCausalLM.from_pretrained(path).eval()
            tokenizer = AutoTokenizer.from_pretrained(path)
            torch.manual_seed(seed + step)
            checkpoints.append(
                {
                    "step": step,
                    "dir": str(path.relative_to(out_dir)),
                    "train_loss": float(np.mean(losses[max(0, step - 50) : step])),
                    "pass_rate": _evaluate(model, tokenizer, eval_rng, config),
                }
            )
            bar.update(1)
        timings["eval_s"] = time.perf_counter() - start - timings["train_s"]

        # `model` and `tokenizer` are now the final checkpoint, reloaded from disk.
        final_step = max(config.save_steps)
        torch.manual_seed(seed + 1_000_003)
        prompts = [make_problem(prompt_rng, op, n).prompt for op, n in config.rollout_prompts]
        rows = sample_groups(
            model, tokenizer, prompts, group_size=config.group_size,
            temperature=config.temperature, max_new_tokens=config.max_new_tokens,
            step=final_step, on_group=lambda: bar.update(1),
        )  # fmt: skip
        tir_rows = []
        for g, n_digits in enumerate(config.tir_digits):
            prompt = make_problem(prompt_rng, TOOL_OP, n_digits).prompt
            pairs = sample_tool_responses(
                model,
                tokenizer,
                [prompt] * config.tir_group_size,
                temperature=config.temperature,
                max_new_tokens=config.tir_max_new_tokens,
            )
            tir_rows += rollout_rows(
                tokenizer, f"g{g:02d}", prompt, [ids for ids, _ in pairs],
                temperature=config.temperature, step=final_step, masks=[m for _, m in pairs],
            )  # fmt: skip
            bar.update(1)
        timings["sample_s"] = time.perf_counter() - start - timings["train_s"] - timings["eval_s"]
        write_jsonl(out_dir / "rollouts.jsonl", rows)
        if tir_rows:
            write_jsonl(out_dir / "rollouts_tir.jsonl", tir_rows)

    timings["total_s"] = time.perf_counter() - start
    summary = {
        "seed": seed,
        "config": dataclasses.asdict(config),
        "n_params": n_params(model),
        "checkpoints": checkpoints,
        "rollouts": _group_stats(rows),
        **({"rollouts_tir": _group_stats(tir_rows)} if tir_rows else {}),
        "timings": {k: round(v, 2) for k, v in timings.items()},
    }
    write_json(out_dir / "lab.json", summary)
    return summary
