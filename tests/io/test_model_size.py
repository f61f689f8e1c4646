"""A checkpoint's parameter count read from its safetensors headers, against the loaded model's;
and None (a model of unknown size) wherever it cannot be read without loading."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from safetensors.torch import load_file, save_file
from tiny import save_checkpoint

from otb_diag.io.model_size import largest_model, parameter_count
from otb_diag.io.scenarios import default_checkpoint
from otb_diag.pipelines.inputs import EnergyInputs, Inputs, SampleInputs
from otb_diag.runtime.threads import NO_MODEL


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, int]:
    """A tiny checkpoint and its model's parameter count, as torch counts it."""
    folder = tmp_path_factory.mktemp("size") / "checkpoint-3"
    model = save_checkpoint(folder)
    return folder, sum(p.numel() for p in model.parameters())


def test_the_headers_count_what_torch_counts(saved: tuple[Path, int], tmp_path: Path) -> None:
    folder, parameters = saved
    assert parameter_count(folder) == parameters
    run = tmp_path / "run"  # a run directory: its checkpoints' model
    shutil.copytree(folder, run / "checkpoint-3")
    assert parameter_count(run) == parameters


def test_sharded_weights_add_up(saved: tuple[Path, int], tmp_path: Path) -> None:
    folder, parameters = saved
    shards = shutil.copytree(folder, tmp_path / "sharded")
    tensors = load_file(shards / "model.safetensors")
    (shards / "model.safetensors").unlink()
    names = sorted(tensors)
    save_file({n: tensors[n] for n in names[::2]}, shards / "model-00001-of-00002.safetensors")
    save_file({n: tensors[n] for n in names[1::2]}, shards / "model-00002-of-00002.safetensors")
    assert parameter_count(shards) == parameters


def test_the_embedded_models() -> None:
    toy = parameter_count(default_checkpoint("default"))
    assert toy == sum(
        t.numel() for t in load_file(default_checkpoint() / "model.safetensors").values()
    )
    assert Inputs().parameters() == toy
    assert EnergyInputs(model_free=True).parameters() == NO_MODEL
    assert SampleInputs(Path("prompts.jsonl")).parameters() == toy
    long = parameter_count(default_checkpoint("long"))
    assert (
        Inputs(ckpt=[default_checkpoint(), default_checkpoint("long")]).parameters() == long > toy
    )


def test_unknown_sizes(saved: tuple[Path, int], tmp_path: Path) -> None:
    folder, parameters = saved
    gguf = tmp_path / "model.gguf"
    gguf.write_bytes(b"GGUF")
    pickled = shutil.copytree(folder, tmp_path / "pickled")
    (pickled / "model.safetensors").rename(pickled / "pytorch_model.bin")
    broken = shutil.copytree(folder, tmp_path / "broken")
    (broken / "model.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json}")
    for path in (gguf, pickled, broken, tmp_path / "missing", tmp_path):
        assert parameter_count(path) is None, path
    assert largest_model([folder, folder]) == parameters
    assert largest_model([folder, gguf]) is None  # one unknown: the rule counts it as large
    assert largest_model([folder, None]) is None
    assert Inputs(ckpt=[tmp_path / "missing"]).parameters() is None
