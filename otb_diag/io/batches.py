"""From rollouts and a checkpoint to the `[B, T]` batch measured under it: the checkpoint side of
the rollouts' path, entered once the rollouts are read (`otb_diag/io/loading.py`)."""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

from otb_diag.io.checkpoint import Checkpoint
from otb_diag.io.load_options import LoadOptions
from otb_diag.io.rollouts.readers import Rollouts
from otb_diag.io.rollouts.to_batch import make_batch
from otb_diag.io.rollouts.tokenize import (
    check_vocab,
    prompts_without_template,
    tokenize_rollouts,
)
from otb_diag.maths.response_batch import ResponseBatch


class RolloutsBatch(NamedTuple):
    """The batch of some rollouts, and what tokenizing them found."""

    batch: ResponseBatch
    round_trip_issues: int  # rows whose text does not round-trip through the tokenizer
    untemplated_prompts: int  # text prompts tokenized without the tokenizer's chat template


def rollouts_batch(
    rollouts: Rollouts, ckpt: Checkpoint | None, chat_template: bool = False
) -> RolloutsBatch:
    """The rollouts as a batch: with a loaded checkpoint, tokenized with its tokenizer (through
    its chat template with `chat_template`) and every id checked against its vocabulary;
    without one, as they are (their own ids and logged statistics: `--model-free`)."""
    if ckpt is None:
        return RolloutsBatch(make_batch(rollouts), 0, 0)
    untemplated = 0 if chat_template else prompts_without_template(rollouts, ckpt.tokenizer)
    tokenized, issues = _tokenized(rollouts, ckpt, chat_template)
    return RolloutsBatch(make_batch(tokenized), issues, untemplated)


def checkpoint_batch(
    path: Path, rollouts: Rollouts, options: LoadOptions
) -> tuple[Checkpoint, ResponseBatch, int]:
    """`checkpoint_rollouts`, its rows padded into one batch."""
    ckpt, tokenized, issues = checkpoint_rollouts(path, rollouts, options)
    return ckpt, make_batch(tokenized), issues


def checkpoint_rollouts(
    path: Path, rollouts: Rollouts, options: LoadOptions
) -> tuple[Checkpoint, Rollouts, int]:
    """Load the checkpoint, tokenize the rollouts with its tokenizer, check every id against its
    vocabulary; returns the checkpoint, the tokenized rollouts (whose rows, or any share of
    them, `otb_diag/io/rollouts/to_batch.py:make_batch` pads into a batch) and the number of
    rows whose text does not round-trip through the tokenizer."""
    ckpt = options.load(path)
    return ckpt, *_tokenized(rollouts, ckpt, options.chat_template)


def _tokenized(rollouts: Rollouts, ckpt: Checkpoint, chat_template: bool) -> tuple[Rollouts, int]:
    """The rollouts tokenized with the checkpoint's tokenizer, every id checked against its
    vocabulary, and the number of rows whose text does not round-trip."""
    tokenized, issues = tokenize_rollouts(rollouts, ckpt.tokenizer, chat_template=chat_template)
    check_vocab(tokenized, ckpt.vocab_size)
    return tokenized, len(issues)
