"""Supervised fine-tuning of the lab model on fresh task problems, saving checkpoints on the way.

Training is deliberately short: the lab wants a policy with intermediate pass rates (short answers
mostly right, long ones often wrong), because groups with mixed rewards are the ones whose
gradient variance a baseline can reduce.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch
from tqdm import tqdm
from transformers import GPT2LMHeadModel, PreTrainedTokenizerFast

from otb_diag.lab.task import (
    CALL,
    MAX_DIGITS,
    MIN_DIGITS,
    TOOL_OP,
    Problem,
    make_problems,
    problem_tokens,
    target,
    tool_output,
)

if TYPE_CHECKING:  # build.py, which holds LabConfig, imports this module
    from otb_diag.lab.build import LabConfig

IGNORE = -100  # label value that torch's cross-entropy skips


def _encode_example(
    tokenizer: PreTrainedTokenizerFast, problem: Problem
) -> tuple[list[int], list[int]]:
    """Token ids of prompt + target response, and labels that train on generated tokens only.

    Prompt tokens and tool-output tokens get `IGNORE`: the policy never produces them, so it is
    neither trained nor (later) scored on them.
    """
    prompt_ids = tokenizer.encode(problem.prompt, add_special_tokens=False)
    response = target(problem)
    response_ids = tokenizer.encode(response, add_special_tokens=False)
    labels = list(response_ids)
    if problem.op == TOOL_OP:
        start = len(tokenizer.encode(CALL, add_special_tokens=False))
        n_tool = len(tokenizer.encode(tool_output(problem.digits), add_special_tokens=False))
        labels[start : start + n_tool] = [IGNORE] * n_tool
    return prompt_ids + response_ids, [IGNORE] * len(prompt_ids) + labels


def _collate(
    examples: list[tuple[list[int], list[int]]], pad_id: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-pad a batch: `input_ids`, `attention_mask`, `labels`, each `[B, T]`."""
    width = max(len(ids) for ids, _ in examples)
    input_ids = torch.full((len(examples), width), pad_id, dtype=torch.long)
    attention_mask = torch.zeros((len(examples), width), dtype=torch.long)
    labels = torch.full((len(examples), width), IGNORE, dtype=torch.long)
    for row, (ids, labs) in enumerate(examples):
        input_ids[row, : len(ids)] = torch.tensor(ids)
        attention_mask[row, : len(ids)] = 1
        labels[row, : len(labs)] = torch.tensor(labs)
    return input_ids, attention_mask, labels


def _sample_n_digits(
    rng: np.random.Generator, low: int = MIN_DIGITS, high: int = MAX_DIGITS
) -> int:
    """Digit count of one training batch: log-uniform on [low, high].

    Log-uniform puts more steps on short problems, so they are learned first while long ones stay
    hard (intermediate pass rates); one length per batch means almost no padding, which makes a
    step about three times cheaper than a batch of mixed lengths.
    """
    u = rng.uniform(math.log(low), math.log(high + 1))
    return min(high, int(math.exp(u)))


def digit_ceiling(
    step: int, steps: int, digits: tuple[int, int], curriculum: tuple[int, float] | None
) -> int:
    """Largest digit count of step `step` (0-based) of `steps`: with ``curriculum = (start,
    fraction)`` it grows linearly from `start` to ``digits[1]`` over the first `fraction` of the
    steps, then stays there; with None it is ``digits[1]`` throughout.

    Why: with learned absolute positions a line's lookup and sum are learned position by
    position, and short problems are learned first; a ceiling that grows lets the long positions
    be trained once the short ones work instead of spending early steps on them.
    """
    if curriculum is None:
        return digits[1]
    start, fraction = curriculum
    progress = min(1.0, step / max(1.0, fraction * steps))
    grown = start + (digits[1] - start) * progress
    return max(digits[0], min(digits[1], int(grown)))


def _lr_at(step: int, steps: int, lr: float, warmup: int) -> float:
    """Linear warm-up, then cosine decay to a tenth of `lr` (a calm end for the last checkpoint)."""
    if step < warmup:
        return lr * (step + 1) / warmup
    progress = (step - warmup) / max(1, steps - warmup)
    return lr * (0.1 + 0.9 * 0.5 * (1.0 + math.cos(math.pi * progress)))


def train(
    model: GPT2LMHeadModel,
    tokenizer: PreTrainedTokenizerFast,
    rng: np.random.Generator,
    config: LabConfig,
    out_dir: Path,
    bar: tqdm | None = None,
) -> list[float]:
    """Train for `config.steps` AdamW steps on fresh problems of `config.ops` (about
    `config.batch_tokens` prompt + answer tokens per batch, one digit count in
    `config.train_digits` per batch, its ceiling growing as `digit_ceiling` says under
    `config.curriculum`); save `out_dir/checkpoint-<step>/` at each of `config.save_steps` (steps
    counted from 1). Returns the per-step training loss.

    Each checkpoint holds the model (safetensors), its generation config and the tokenizer, so it
    loads with `AutoModelForCausalLM` / `AutoTokenizer.from_pretrained` like a real one.
    """
    optimizer = torch.optim.AdamW(model.parameters(), lr=config.lr, weight_decay=0.01)
    losses = []
    model.train()
    for step in range(1, config.steps + 1):
        for group in optimizer.param_groups:
            group["lr"] = _lr_at(step - 1, config.steps, config.lr, config.warmup)
        ceiling = digit_ceiling(step - 1, config.steps, config.train_digits, config.curriculum)
        n_digits = _sample_n_digits(rng, config.train_digits[0], ceiling)
        # A fixed token budget per batch: short problems come many to a batch at almost no extra
        # cost (a step on a small model is mostly overhead), so they are learned well.
        n_problems = max(1, config.batch_tokens // problem_tokens(config.ops[0], n_digits))
        problems = make_problems(rng, n_problems, n_digits, config.ops)
        batch = [_encode_example(tokenizer, p) for p in problems]
        input_ids, attention_mask, labels = _collate(batch, tokenizer.pad_token_id)
        loss = model(input_ids=input_ids, attention_mask=attention_mask, labels=labels).loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        losses.append(loss.item())
        if step in config.save_steps:
            checkpoint = out_dir / f"checkpoint-{step}"
            model.save_pretrained(str(checkpoint), safe_serialization=True)
            tokenizer.save_pretrained(str(checkpoint))
        if bar is not None:
            bar.set_postfix(loss=f"{loss.item():.3f}", refresh=False)
            bar.update(1)
    model.eval()
    return losses
