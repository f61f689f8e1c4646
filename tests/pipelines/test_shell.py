"""`pipelines/shell.py:run_recipe` in a world of one: the body's files and the record move into
--out together, a body stopped early leaves no record, and a command without a folder gets
none. (Its ranks: the torchrun tests of the commands built on it.)"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from otb_diag.errors import InputError
from otb_diag.io.load_options import LoadOptions
from otb_diag.pipelines.shell import Stage, run_recipe


@dataclass(frozen=True)
class Done:
    files: int

    def to_json(self) -> dict[str, int]:
        return {"files": self.files}


def test_the_body_and_the_record_move_into_out_together(tmp_path: Path) -> None:
    def body(stage: Stage) -> Done:
        assert stage.into is not None and stage.into.parent == tmp_path / "out"
        assert stage.progress
        (stage.into / "table.csv").write_text("a\n1\n")
        return Done(1)

    result = run_recipe(body, out=tmp_path / "out", record="manifest.json")
    assert result == Done(1)
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["manifest.json", "table.csv"]


def test_a_body_stopped_early_leaves_no_record_and_no_folder(tmp_path: Path) -> None:
    assert run_recipe(lambda stage: None, out=tmp_path / "out", progress=False) is None
    assert not (tmp_path / "out").exists()


def test_a_command_without_a_folder_runs_on_rank_0_alone() -> None:
    def body(stage: Stage) -> Done:
        assert stage.into is None
        return Done(0)

    assert run_recipe(body, every_rank=False) == Done(0)


def test_a_rank_0_body_is_staged_like_every_ranks(tmp_path: Path) -> None:
    """`every_rank=False` with a folder (dynamics): rank 0's body writes into the staging
    folder, and its files and the record move into --out together, as with every rank."""

    def body(stage: Stage) -> Done:
        assert stage.into is not None and stage.into.parent == tmp_path / "out"
        (stage.into / "dynamics.csv").write_text("a\n1\n")
        return Done(1)

    assert run_recipe(body, out=tmp_path / "out", record="collapse.json", every_rank=False)
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["collapse.json", "dynamics.csv"]


def test_the_load_options_are_checked_before_the_body(tmp_path: Path) -> None:
    def body(stage: Stage) -> Done:
        raise AssertionError("the body ran")

    with pytest.raises(InputError, match="no CUDA device|unknown device"):
        run_recipe(body, out=tmp_path / "out", load=LoadOptions(device="cuda:7"))
    assert not (tmp_path / "out").exists()


def test_a_folder_the_body_writes_replaces_the_last_runs_whole(tmp_path: Path) -> None:
    """`lab build` again into the same --out: its `checkpoints/` replaces the last one (a stale
    checkpoint-300 goes), and a file of --out the run does not write is left alone."""
    out = tmp_path / "out"
    (out / "checkpoints/checkpoint-300").mkdir(parents=True)
    (out / "notes.txt").write_text("mine")

    def body(stage: Stage) -> Done:
        assert stage.into is not None
        (stage.into / "checkpoints/checkpoint-100").mkdir(parents=True)
        (stage.into / "checkpoints/checkpoint-100/config.json").write_text("{}")
        return Done(1)

    assert run_recipe(body, out=out, record=None) == Done(1)
    assert [p.name for p in (out / "checkpoints").iterdir()] == ["checkpoint-100"]
    assert (out / "notes.txt").read_text() == "mine"
    assert sorted(p.name for p in out.iterdir()) == ["checkpoints", "notes.txt"]


def test_an_unstaged_body_writes_into_out_as_it_goes(tmp_path: Path) -> None:
    """`staged=False` (train): the body's files are in --out while it runs, so a run stopped
    by an error keeps them; the record is written last, only on success."""
    out = tmp_path / "out"

    def body(stage: Stage) -> Done:
        assert stage.into == out
        (out / "metrics.jsonl").write_text('{"step": 1}\n')
        return Done(1)

    assert run_recipe(body, out=out, record="train.json", staged=False) == Done(1)
    assert sorted(p.name for p in out.iterdir()) == ["metrics.jsonl", "train.json"]

    def fails(stage: Stage) -> Done:
        (out / "metrics.jsonl").write_text('{"step": 1}\n{"step": 2}\n')
        raise InputError("step 3 diverged")

    (out / "train.json").unlink()
    with pytest.raises(InputError, match="diverged"):
        run_recipe(fails, out=out, record="train.json", staged=False)
    assert sorted(p.name for p in out.iterdir()) == ["metrics.jsonl"]
