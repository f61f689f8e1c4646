"""Rollout rows and files for the reader tests (test_readers, test_reader_errors,
test_tokenize): valid rows, writers for JSONL and Parquet, a character tokenizer."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from tokenizers import Tokenizer, decoders, models, processors
from transformers import PreTrainedTokenizerFast

from otb_diag.errors import InputError
from otb_diag.io.loading import load_rollouts


def good_row(**changes: Any) -> dict[str, Any]:
    """A valid row with ids and every per-token field; `changes` overrides or (None) removes."""
    row = {
        "group": "g",
        "prompt": "ab",
        "response": "cab",
        "prompt_ids": [1, 2],
        "response_ids": [3, 1, 2],
        "reward": 1.0,
        "token_rewards": [0.0, 0.0, 1.0],
        "mask": [1, 0, 1],
        "step": 7,
        "logprobs": [-1.0, -1.2, -1.5],
        "sum_pi2": [0.5, 0.6, 0.7],
        "is_weights": [1.0, 0.9, 1.1],
        "temperature": 0.8,
    }
    row.update(changes)
    return {k: v for k, v in row.items() if v is not None}


def text_row(**changes: Any) -> dict[str, Any]:
    """A valid row with text only (no ids, no per-token fields)."""
    row = {"group": "g", "prompt": "ab", "response": "cab", "reward": 1.0}
    row.update(changes)
    return {k: v for k, v in row.items() if v is not None}


def write_jsonl(path: Path, rows: list[dict[str, Any] | str]) -> Path:
    """One JSON object (or a raw string, for malformed lines) per line."""
    lines = [r if isinstance(r, str) else json.dumps(r, ensure_ascii=False) for r in rows]
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


def write_parquet(path: Path, rows: list[dict[str, Any]]) -> Path:
    keys = list(dict.fromkeys(k for r in rows for k in r))
    pq.write_table(pa.Table.from_pylist([{k: r.get(k) for k in keys} for r in rows]), path)
    return path


def char_tokenizer() -> PreTrainedTokenizerFast:
    """One token per character of "abc xyz:=" plus <unk> and a BOS <s> added to encodings."""
    vocab = {tok: i for i, tok in enumerate(["<unk>", "<s>", *"abc xyz:="])}
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
    backend.decoder = decoders.Fuse()
    backend.post_processor = processors.TemplateProcessing(
        single="<s> $A", special_tokens=[("<s>", vocab["<s>"])]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        bos_token="<s>",
        unk_token="<unk>",
        clean_up_tokenization_spaces=False,
    )


def read_error(path: Path) -> str:
    with pytest.raises(InputError) as info:
        load_rollouts(path)
    return str(info.value)
