"""Tokenizing text rows and checking ids against the vocabulary (otb_diag/io/rollouts/readers.py:
tokenize_rollouts, check_vocab)."""

from __future__ import annotations

from pathlib import Path

import pytest
from rollout_files import char_tokenizer, good_row, text_row, write_jsonl, write_parquet

from otb_diag.errors import InputError
from otb_diag.io.loading import load_rollouts
from otb_diag.io.rollouts.tokenize import check_vocab, tokenize_rollouts


def test_text_and_ids_disagreeing_keeps_the_ids(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "r.jsonl", [good_row(response="something else")])
    rollouts, issues = tokenize_rollouts(load_rollouts(path), char_tokenizer())
    assert rollouts.responses[0].response_ids == [3, 1, 2]
    assert issues == []


def test_token_id_outside_the_vocabulary(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "r.jsonl", [good_row(), good_row(response_ids=[3, 11, 2])])
    rollouts = load_rollouts(path)
    check_vocab(rollouts, 12)
    with pytest.raises(InputError) as info:
        check_vocab(rollouts, 11)
    message = str(info.value)
    assert message.startswith(f"{path}, line 2, field 'response_ids': token id 11 ")
    assert "size 11" in message


def test_token_id_outside_the_vocabulary_names_the_parquet_row(tmp_path: Path) -> None:
    path = write_parquet(tmp_path / "r.parquet", [good_row(prompt_ids=[1, 40])])
    with pytest.raises(InputError, match=r"row 0, field 'prompt_ids': token id 40 "):
        check_vocab(load_rollouts(path), 12)


# --- tokenizing -----------------------------------------------------------------------------


def test_tokenize_fills_ids_from_text(tmp_path: Path) -> None:
    tok = char_tokenizer()
    path = write_jsonl(tmp_path / "r.jsonl", [text_row(prompt="x:=", response="a b"), good_row()])
    rollouts, issues = tokenize_rollouts(load_rollouts(path), tok)
    assert issues == []
    filled, given = rollouts.responses
    bos, x, colon, eq, a, space, b = tok.convert_tokens_to_ids(["<s>", *"x:=a b"])
    assert filled.prompt_ids == [bos, x, colon, eq]  # prompts get the tokenizer's BOS
    assert filled.response_ids == [a, space, b]  # responses do not
    assert given.prompt_ids == [1, 2] and given.response_ids == [3, 1, 2]
    check_vocab(rollouts, len(tok))


def test_tokenize_reports_texts_that_do_not_round_trip(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "r.jsonl", [text_row(), text_row(response="abé")])
    rollouts, issues = tokenize_rollouts(load_rollouts(path), char_tokenizer())
    (issue,) = issues
    assert (issue.location, issue.field, issue.sample) == ("line 2", "response", 1)
    assert issue.text == "abé" and issue.decoded == "ab<unk>"
    assert "line 2, field 'response'" in str(issue)
    assert len(rollouts.responses[1].response_ids or []) == 3


def test_tokenized_length_mismatch_names_line_and_field(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "r.jsonl", [text_row(), text_row(mask=[1, 1])])
    rollouts = load_rollouts(path)  # no ids yet: the length cannot be checked
    with pytest.raises(InputError) as info:
        tokenize_rollouts(rollouts, char_tokenizer())
    message = str(info.value)
    assert message.startswith(f"{path}, line 2, field 'mask': has 2 entries")
    assert "3 tokens (as tokenized by the checkpoint's tokenizer)" in message
