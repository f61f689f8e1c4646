"""From rollouts and a checkpoint to the `[B, T]` batch measured under it: the checkpoint side of
the rollouts' path, entered once the rollouts are read (`otb_diag/io/loading.py`)."""

from __future__ import annotations

from pathlib import Path

from otb_diag.io.checkpoint import Checkpoint
from otb_diag.io.load_options import LoadOptions
from otb_diag.io.rollouts.readers import Rollouts
from otb_diag.io.rollouts.to_batch import make_batch
from otb_diag.io.rollouts.tokenize import check_vocab, tokenize_rollouts
from otb_diag.maths.response_batch import ResponseBatch


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
    tokenized, issues = tokenize_rollouts(
        rollouts, ckpt.tokenizer, chat_template=options.chat_template
    )
    check_vocab(tokenized, ckpt.vocab_size)
    return ckpt, tokenized, len(issues)
