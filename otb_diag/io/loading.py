"""From the user's paths to measurable tensors: read the rollouts, load each checkpoint, tokenize
and bound-check the rollouts against it, and describe the inputs for a summary.json. Shared by
every command that measures rollouts under a checkpoint."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from otb_diag.errors import InputError
from otb_diag.io.checkpoint import Checkpoint
from otb_diag.io.load_options import LoadOptions as LoadOptions  # re-exported
from otb_diag.io.provenance import checkpoint_fingerprint, file_sha256
from otb_diag.io.rollouts.readers import Rollouts, check_vocab, tokenize_rollouts
from otb_diag.io.rollouts.stream import read_set
from otb_diag.io.rollouts.to_batch import make_batch
from otb_diag.maths.response_batch import ResponseBatch


def load_rollouts(
    path: Path,
    temperature: float | None = None,
    *,
    steps: str | None = None,
    reward_columns: list[str] | None = None,
) -> Rollouts:
    """Read and validate rollouts (a file, a directory or a glob; rows with a step in `steps`,
    "A-B") through the streaming index, whole (`otb_diag/io/rollouts/stream.py:read_set`);
    `reward_columns` names a TRL completion log's reward columns; `temperature`, when given,
    overrides every row's τ."""
    return with_temperature(read_set(path, steps=steps, reward_columns=reward_columns), temperature)


def with_temperature(rollouts: Rollouts, temperature: float | None) -> Rollouts:
    """`rollouts` with every row's τ replaced by `temperature`, when given."""
    if temperature is None:
        return rollouts
    if temperature <= 0:
        raise InputError(f"temperature must be positive, got {temperature}", field="temperature")
    responses = [replace(r, temperature=temperature) for r in rollouts.responses]
    return replace(rollouts, responses=responses)


def response_tokens(rollouts: Rollouts) -> int | None:
    """Total response tokens, or None while some rows are text only (not yet tokenized)."""
    lengths = [len(r.response_ids) for r in rollouts.responses if r.response_ids is not None]
    return sum(lengths) if len(lengths) == len(rollouts.responses) else None


def checkpoint_batch(
    path: Path, rollouts: Rollouts, options: LoadOptions
) -> tuple[Checkpoint, ResponseBatch, int]:
    """Load the checkpoint, tokenize the rollouts with its tokenizer, check every id against its
    vocabulary; returns the checkpoint, the batch and the number of rows whose text does not
    round-trip through the tokenizer."""
    ckpt = options.load(path)
    tokenized, issues = tokenize_rollouts(
        rollouts, ckpt.tokenizer, chat_template=options.chat_template
    )
    check_vocab(tokenized, ckpt.vocab_size)
    return ckpt, make_batch(tokenized), len(issues)


def checkpoint_record(ckpt: Checkpoint, full_hash: bool = False) -> dict[str, Any]:
    """Path, hash (`checkpoint_fingerprint`: what was hashed is said beside it) and step."""
    return {
        "path": str(ckpt.path), **checkpoint_fingerprint(ckpt.path, full=full_hash),
        "step": ckpt.step,
    }  # fmt: skip


def rollouts_record(rollouts: Rollouts) -> dict[str, Any]:
    """Path, format and hash of the rollouts; with several files, each file's hash."""
    files = rollouts.files or [Path(rollouts.path)]
    record: dict[str, Any] = {"path": str(Path(rollouts.path).resolve()), "format": rollouts.format}
    if len(files) == 1:
        return {**record, "sha256": file_sha256(files[0])}
    return {
        **record,
        "files": [{"path": str(f.resolve()), "sha256": file_sha256(f)} for f in files],
    }
