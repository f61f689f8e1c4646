"""Tests for otb_diag.checkpoint on a tiny random GPT-2 and a character-level tokenizer."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
import torch
from tiny import MODEL_VOCAB, char_tokenizer, save_checkpoint
from transformers import GPT2LMHeadModel

from otb_diag.errors import InputError
from otb_diag.io.checkpoint import (
    checkpoint_step,
    find_checkpoints,
    load_checkpoint,
    load_tokenizer,
)

os.environ["HF_HUB_OFFLINE"] = "1"

TOKENS = torch.tensor([[2, 3, 4, 5, 6]])


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, GPT2LMHeadModel]:
    """A saved tiny checkpoint and the model it was saved from (do not modify: copy it)."""
    directory = tmp_path_factory.mktemp("ckpt") / "model"
    return directory, save_checkpoint(directory)


@pytest.fixture
def ckpt(saved: tuple[Path, GPT2LMHeadModel], tmp_path: Path) -> Path:
    """A private copy of the saved checkpoint, free to break."""
    return Path(shutil.copytree(saved[0], tmp_path / "checkpoint-7"))


def assert_refused(path: Path, *fragments: str, **kwargs: object) -> None:
    with pytest.raises(InputError) as info:
        load_checkpoint(path, **kwargs)
    message = str(info.value)
    assert str(path) in message
    for fragment in fragments:
        assert fragment in message


def test_load_round_trip_gives_the_same_logits(saved: tuple[Path, GPT2LMHeadModel]) -> None:
    directory, original = saved
    loaded = load_checkpoint(directory)
    assert loaded.path == directory.resolve()
    assert not loaded.model.training
    assert loaded.vocab_size == MODEL_VOCAB
    assert loaded.dtype == torch.float32
    assert loaded.device == torch.device("cpu")
    assert loaded.step is None
    assert loaded.tokenizer("hi").input_ids == [10, 11]
    with torch.no_grad():
        assert torch.equal(loaded.model(TOKENS).logits, original(TOKENS).logits)


def test_step_comes_from_the_directory_name(ckpt: Path) -> None:
    assert load_checkpoint(ckpt).step == 7


def test_bfloat16_dtype(saved: tuple[Path, GPT2LMHeadModel]) -> None:
    loaded = load_checkpoint(saved[0], dtype="bfloat16")
    assert loaded.dtype == torch.bfloat16
    assert loaded.model.lm_head.weight.dtype == torch.bfloat16


def test_unknown_dtype_is_refused(saved: tuple[Path, GPT2LMHeadModel]) -> None:
    with pytest.raises(InputError, match="float64"):
        load_checkpoint(saved[0], dtype="float64")


def test_missing_directory(tmp_path: Path) -> None:
    assert_refused(tmp_path / "nope", "does not exist")


def test_file_instead_of_directory(tmp_path: Path) -> None:
    file = tmp_path / "model.safetensors"
    file.write_bytes(b"")
    assert_refused(file, "is a file")


def test_no_config(ckpt: Path) -> None:
    (ckpt / "config.json").unlink()
    assert_refused(ckpt, "no config.json")


def test_malformed_config(ckpt: Path) -> None:
    (ckpt / "config.json").write_text('{"model_type": "gpt2",\n', encoding="utf-8")
    assert_refused(ckpt, "config.json", "not valid JSON")


def test_no_weights(ckpt: Path) -> None:
    (ckpt / "model.safetensors").unlink()
    (ckpt / "training_args.bin").write_bytes(b"not a model")
    assert_refused(ckpt, "no model weights")


def test_pickled_weights_need_allow_pickle(ckpt: Path, saved: tuple[Path, GPT2LMHeadModel]) -> None:
    original = saved[1]
    (ckpt / "model.safetensors").unlink()
    torch.save(original.state_dict(), ckpt / "pytorch_model.bin")
    assert_refused(ckpt, "pickled", "allow_pickle")

    loaded = load_checkpoint(ckpt, allow_pickle=True)
    with torch.no_grad():
        assert torch.equal(loaded.model(TOKENS).logits, original(TOKENS).logits)


def test_safetensors_win_over_pickled_weights(ckpt: Path) -> None:
    # Unpickling this file would fail, so the load only passes if the .bin is never read.
    (ckpt / "pytorch_model.bin").write_bytes(b"not a pickle")
    assert load_checkpoint(ckpt).vocab_size == MODEL_VOCAB


def test_auto_map_needs_trust_remote_code(ckpt: Path) -> None:
    config = json.loads((ckpt / "config.json").read_text(encoding="utf-8"))
    config["auto_map"] = {"AutoModelForCausalLM": "modeling_evil.EvilForCausalLM"}
    (ckpt / "config.json").write_text(json.dumps(config), encoding="utf-8")
    assert_refused(ckpt, "auto_map", "trust_remote_code")


def test_unknown_model_type_needs_trust_remote_code(ckpt: Path) -> None:
    config = json.loads((ckpt / "config.json").read_text(encoding="utf-8"))
    config["model_type"] = "no-such-architecture"
    (ckpt / "config.json").write_text(json.dumps(config), encoding="utf-8")
    assert_refused(ckpt, "no-such-architecture", "trust_remote_code")


def test_missing_tokenizer(ckpt: Path) -> None:
    (ckpt / "tokenizer.json").unlink()
    assert_refused(ckpt, "no tokenizer files", "actor/huggingface")


def test_tokenizer_bigger_than_model_vocab(ckpt: Path) -> None:
    # 26 letters + space + 2 specials = 29 fits; 36 "letters" make 39 tokens > 30 rows.
    char_tokenizer(n_letters=36).save_pretrained(ckpt)
    assert_refused(ckpt, "tokenizer does not match the checkpoint", "39")
    with pytest.raises(InputError, match="tokenizer does not match the checkpoint"):
        load_tokenizer(ckpt)


def test_load_tokenizer_without_weights(ckpt: Path) -> None:
    # Inspecting rollouts needs the tokenizer and the vocabulary size, never the weights.
    (ckpt / "model.safetensors").unlink()
    tokenizer, vocab_size = load_tokenizer(ckpt)
    assert vocab_size == 30
    ids = tokenizer.encode("abc", add_special_tokens=False)
    assert tokenizer.convert_ids_to_tokens(ids) == ["a", "b", "c"]


def test_find_checkpoints_on_a_checkpoint(ckpt: Path) -> None:
    assert find_checkpoints(ckpt) == [ckpt]


def test_find_checkpoints_trl_tree_sorted_by_step(tmp_path: Path) -> None:
    for name in ("checkpoint-10", "checkpoint-2", "runs", "checkpoint-final"):
        (tmp_path / name).mkdir()
    (tmp_path / "checkpoint-3").write_text("a file, not a checkpoint", encoding="utf-8")
    assert find_checkpoints(tmp_path) == [tmp_path / "checkpoint-2", tmp_path / "checkpoint-10"]


def test_find_checkpoints_verl_tree(saved: tuple[Path, GPT2LMHeadModel], tmp_path: Path) -> None:
    nested = tmp_path / "global_step_5" / "actor" / "huggingface"
    shutil.copytree(saved[0], nested)
    (tmp_path / "global_step_1" / "actor").mkdir(parents=True)
    (tmp_path / "global_step_1" / "actor" / "config.json").write_text("{}", encoding="utf-8")
    assert find_checkpoints(tmp_path) == [tmp_path / "global_step_1" / "actor", nested]
    assert load_checkpoint(nested).step == 5


def test_find_checkpoints_verl_step_without_model(tmp_path: Path) -> None:
    (tmp_path / "global_step_5" / "actor").mkdir(parents=True)
    with pytest.raises(InputError, match="global_step_5"):
        find_checkpoints(tmp_path)


def test_find_checkpoints_nothing_found(tmp_path: Path) -> None:
    (tmp_path / "logs").mkdir()
    with pytest.raises(InputError) as info:
        find_checkpoints(tmp_path)
    assert str(tmp_path) in str(info.value)
    assert "global_step_<n>" in str(info.value)


@pytest.mark.parametrize(
    ("path", "step"),
    [
        ("runs/checkpoint-10", 10),
        ("out/global_step_5", 5),
        ("out/global_step_5/actor", 5),
        ("out/global_step_5/actor/huggingface", 5),
        ("out/global_step_5/huggingface", 5),
        ("checkpoint-final", None),
        ("model", None),
        ("checkpoint-10/model", None),
    ],
)
def test_checkpoint_step(path: str, step: int | None) -> None:
    assert checkpoint_step(path) == step
