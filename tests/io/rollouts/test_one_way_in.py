"""One way in for rollouts (`otb_diag/io/rollouts/stream.py`): the whole set that
`variance-compare`, `rollouts inspect` and the API read is the streamed set, row for row;
following a path from `otb_diag/io/loading.py:load_rollouts` down through io/ enters each module
once, and so does following `rollouts_path` from variance-compare's and energy's entry points to
their tables (ARCHITECTURE.md, "Data flow")."""

from __future__ import annotations

import hashlib
import json
import sys
from collections.abc import Callable
from dataclasses import replace
from inspect import CO_ASYNC_GENERATOR, CO_COROUTINE, CO_GENERATOR
from pathlib import Path
from types import FrameType
from typing import Any

import pandas as pd
import pytest
from test_stream import rows, write_parquet
from unwritten_figures import unwritten_figures

from otb_diag.io.loading import (
    chunk_groups,
    group_rows,
    load_rollout_set,
    load_rollouts,
    rollouts_record,
)
from otb_diag.io.rollouts.stream import index_rollouts, read_set, stream_chunks

_LAZY = CO_GENERATOR | CO_COROUTINE | CO_ASYNC_GENERATOR


def module_entries(call: Callable[[], Any], on_path: Callable[[str], bool]) -> list[str]:
    """The modules named by `on_path` that `call` enters, in order: a module is entered when one
    of its functions runs for the first time, called from another module on the path; the
    caller is the nearest enclosing frame on the path (what lies between, a runtime decorator, a
    service such as io/atomic.py, code Python generates like a dataclass's `__init__`, is seen
    through); consecutive entries into one module are one stay. Pulling the next item from an
    iterator a module handed over is not a call (generator bodies are not counted), nor is
    importing a module (variance-compare imports its measuring modules once it has a signal)."""
    entries: list[str] = []
    decided: set[Any] = set()  # code objects already entered, or off the path

    def module(frame: FrameType) -> str:
        return frame.f_globals.get("__name__", "")

    def trace(frame: FrameType, _event: str, _: Any) -> None:
        # sys.settrace, not sys.setprofile: only the calls of Python functions come here (not
        # those of C functions, nor any return), and returning None traces no line of the frame;
        # each code object is looked at once. The run under it costs a few times less.
        code = frame.f_code
        if code in decided:
            return
        decided.add(code)
        if code.co_flags & _LAZY or code.co_name == "<module>":  # an import holds no rollouts
            return
        if not code.co_filename.endswith(".py") or not on_path(module(frame)):
            return
        caller = frame.f_back
        while caller is not None and not (
            caller.f_code.co_filename.endswith(".py") and on_path(module(caller))
        ):
            caller = caller.f_back
        name = module(frame)
        if (caller is None or module(caller) != name) and (not entries or entries[-1] != name):
            entries.append(name)

    sys.settrace(trace)
    try:
        call()
    finally:
        sys.settrace(None)
    return entries


def io_entries(call: Callable[[], Any]) -> list[str]:
    """The io/ modules `call` enters, in order (`module_entries`)."""
    return module_entries(call, lambda name: name.startswith("otb_diag.io"))


def write_jsonl(path: Path, records: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def trl_dump(folder: Path, samples: int = 3) -> Path:
    """A TRL output directory with two completion logs (two steps, two prompts of `samples`)."""
    (folder / "completions").mkdir(parents=True)
    for step in (1, 2):
        table = [
            {
                "step": step,
                "prompt": f"p{g}",
                "completion": f"c{k}",
                "accuracy_reward": float(k % 2),
                "advantage": 0.5 * k - 0.5,
            }
            for g in range(2)
            for k in range(samples)
        ]
        pd.DataFrame(table).to_parquet(folder / "completions" / f"completions_{step:05d}.parquet")
    return folder


LOAD_PATH = [
    "otb_diag.io.loading",
    "otb_diag.io.rollouts.stream",
    "otb_diag.io.rollouts.scan",
    "otb_diag.io.rollouts.sources",
    "otb_diag.io.rollouts.readers",
    "otb_diag.io.rollouts.records",
    "otb_diag.io.trainers",
    "otb_diag.io.trainers.trl",
    "otb_diag.io.rollouts.rows",
    "otb_diag.io.rollouts.probability_checks",
]


def test_the_load_path_enters_each_module_once(tmp_path: Path) -> None:
    """The trace written down in ARCHITECTURE.md, for a TRL dump (the longest path)."""
    run = trl_dump(tmp_path / "run")
    assert io_entries(lambda: load_rollouts(run, steps="2")) == LOAD_PATH


# Following `rollouts_path` from variance-compare's entry point: the settings checked, down
# through io/ once (the load hands the recipe one `RolloutSet`, whose groups' signal it checks),
# then the measurement (rollouts with a signal), the checkpoint side (tokenize, check, batch)
# once, and the tables read off the measurements with their intervals. ARCHITECTURE.md writes
# it down.
VARIANCE_PATH = [
    "otb_diag.pipelines.variance.recipe",
    "otb_diag.pipelines.variance.settings",
    *LOAD_PATH,
    "otb_diag.pipelines.variance.compare",
    "otb_diag.pipelines.variance.measure",
    "otb_diag.io.batches",
    "otb_diag.io.rollouts.tokenize",
    "otb_diag.io.rollouts.to_batch",
    "otb_diag.pipelines.variance.conclusions",
    "otb_diag.pipelines.variance.evidence",
]


def source(module: str) -> str:
    """A module's file as ARCHITECTURE.md names it: `io/loading.py`, `io/trainers/__init__.py`."""
    path = Path(sys.modules[module].__file__ or "")
    return path.relative_to(Path(sys.modules["otb_diag"].__file__ or "").parent).as_posix()


def on_rollouts_path(command: str) -> Callable[[str], bool]:
    """The modules that hold the rollouts on their way to a batch: io/loading.py, io/batches.py,
    io/rollouts/, io/trainers/ and the command's own package (`pipelines/<command>/`). What
    they call on the way (the runtime, a checkpoint's loading, hashing, the maths, the plots) is
    seen through."""
    package = f"otb_diag.pipelines.{command}."
    return lambda name: (
        name in ("otb_diag.io.loading", "otb_diag.io.batches")
        or name.startswith(("otb_diag.io.rollouts", "otb_diag.io.trainers", package))
    )


def written_down(path: list[str]) -> bool:
    """Whether ARCHITECTURE.md writes `path` down, its modules named as files joined by →."""
    written = " → ".join(f"`{source(m)}`" for m in path)
    architecture = " ".join((Path(__file__).parents[3] / "ARCHITECTURE.md").read_text().split())
    return written in architecture


def test_variance_compare_follows_the_rollouts_path_once(tmp_path: Path) -> None:
    """`run_variance` end to end on a TRL dump (text rows: tokenized, some not round-tripping,
    under the tiny checkpoint; a model mode beside proxy, so fidelity rows too) enters each
    module of the rollouts' path once, in the order ARCHITECTURE.md writes down."""
    from tiny import save_checkpoint

    from otb_diag.pipelines.inputs import Inputs
    from otb_diag.pipelines.variance.recipe import VarianceSettings, run_variance

    save_checkpoint(tmp_path / "checkpoint-3", seed=3)
    run = trl_dump(tmp_path / "run", samples=4)
    settings = VarianceSettings(
        modes=("proxy", "head"), group_sizes=(2,), draws=4, bootstrap=5, sketch_dim=8,
        steps="2",
    )  # fmt: skip
    result = None

    def call() -> None:
        nonlocal result
        inputs = Inputs(ckpt=[tmp_path / "checkpoint-3"], rollouts=run)
        with unwritten_figures():  # the plots are off the path: rendering them is only time
            result = run_variance(inputs, tmp_path / "out", settings, progress=False)

    assert module_entries(call, on_rollouts_path("variance")) == VARIANCE_PATH
    assert result is not None and result.inputs.rollouts.format == "trl-parquet"
    assert written_down(VARIANCE_PATH)


# Following `rollouts_path` from energy's entry point: the settings checked, the measuring loop
# entered, which loads the rollouts as a stream (down through io/ once: the index pass, the
# chunks, their record), then per chunk the checkpoint side (tokenize, check, batch) and the
# audit; reading the next chunk goes down the same path again, through functions already run.
ENERGY_PATH = [
    "otb_diag.pipelines.energy.recipe",
    "otb_diag.pipelines.energy.settings",
    "otb_diag.pipelines.energy.measure",
    *LOAD_PATH,
    "otb_diag.io.batches",
    "otb_diag.io.rollouts.tokenize",
    "otb_diag.io.rollouts.to_batch",
    "otb_diag.pipelines.energy.audit",
]


def test_energy_follows_the_rollouts_path_once(tmp_path: Path) -> None:
    """`run_energy` end to end on a TRL dump (text rows, tokenized under the tiny checkpoint;
    trainer advantages, audited; chunks of a few groups, so the stream is read more than once)
    enters each module of the rollouts' path once, in the order ARCHITECTURE.md writes down."""
    from tiny import save_checkpoint

    from otb_diag.pipelines.energy import measure as energy_stream
    from otb_diag.pipelines.energy.recipe import EnergySettings, run_energy
    from otb_diag.pipelines.inputs import EnergyInputs

    save_checkpoint(tmp_path / "checkpoint-3", seed=3)
    run = trl_dump(tmp_path / "run", samples=4)
    result = None

    def call() -> None:
        nonlocal result
        inputs = EnergyInputs(ckpt=[tmp_path / "checkpoint-3"], rollouts=run)
        out = tmp_path / "out"
        with unwritten_figures():  # the plots are off the path: rendering them is only time
            result = run_energy(inputs, out, EnergySettings(steps="2"), progress=False)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(energy_stream, "CHUNK_TOKENS", 4)  # a group per chunk
        assert module_entries(call, on_rollouts_path("energy")) == ENERGY_PATH
    assert result is not None and result.inputs.rollouts.format == "trl-parquet"
    assert result.advantage_audit is not None and result.totals.groups == 2
    assert written_down(ENERGY_PATH)


@pytest.mark.parametrize("kind", ["plain-jsonl", "plain-parquet", "verl-jsonl", "two-files"])
def test_no_module_is_returned_to(tmp_path: Path, kind: str) -> None:
    """Whatever the set, the path goes down through io/ once: no module is entered again after
    another one was."""
    plain = rows(0, 3, 4)
    verl = [{"input": f"p{k % 2}", "output": "o", "score": 1.0, "step": 3} for k in range(6)]
    spec: Path = tmp_path
    if kind == "plain-jsonl":
        spec = write_jsonl(tmp_path / "r.jsonl", plain)
    elif kind == "plain-parquet":
        spec = write_parquet(tmp_path / "r.parquet", plain)
    elif kind == "verl-jsonl":
        spec = write_jsonl(tmp_path / "3.jsonl", verl)
    else:  # a directory of a JSON Lines file and a Parquet file
        write_jsonl(tmp_path / "1.jsonl", plain)
        write_parquet(tmp_path / "2.parquet", plain)
    entries = io_entries(lambda: load_rollouts(spec, 0.7))
    assert len(entries) == len(set(entries)), entries
    # verl's records are mapped by its module where TRL's are by TRL's (its uid forms)
    path = [m.replace(".trl", ".verl") if kind == "verl-jsonl" else m for m in LOAD_PATH]
    assert [m for m in path if m in entries] == entries  # the order of the one path


@pytest.mark.slow  # runs a command end to end (a real run: seconds)
@pytest.mark.parametrize("kind", ["plain-jsonl", "plain-parquet", "two-files"])
def test_energy_returns_to_no_module(
    tmp_path: Path, kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`energy --model-free` over chunks of a few groups, whatever the set: rows validated by the
    index pass (JSON Lines), or a plain Parquet file indexed from its columns and its rows
    decoded only when its chunks are read (the rows' modules are then entered later, once), or
    a directory of both: no module of the rollouts' path is entered again after another one."""
    from otb_diag.pipelines.energy import measure as energy_stream
    from otb_diag.pipelines.energy.recipe import EnergySettings, run_energy
    from otb_diag.pipelines.inputs import EnergyInputs

    monkeypatch.setattr(energy_stream, "CHUNK_TOKENS", 60)
    spec: Path = tmp_path / "dumps"
    spec.mkdir()
    if kind != "plain-parquet":
        write_jsonl(spec / "1.jsonl", rows(0, 3, 4))
    if kind != "plain-jsonl":
        write_parquet(spec / "2.parquet", rows(1, 3, 4))

    def call() -> None:
        settings = EnergySettings()
        run_energy(EnergyInputs(rollouts=spec, model_free=True), tmp_path / "out", settings)

    entries = module_entries(call, on_rollouts_path("energy"))
    assert len(entries) == len(set(entries)), entries
    assert set(entries) >= set(LOAD_PATH) - {"otb_diag.io.trainers.trl"}


@pytest.mark.parametrize("steps", [None, "1-2"])
def test_the_whole_set_is_the_streamed_set(tmp_path: Path, steps: str | None) -> None:
    """`read_set` gives, row for row, what `stream_chunks` hands over chunk by chunk (group
    names qualified across files, sample numbers, every field), and the clamped round-off of
    every row of the set."""
    for step, name in ((1, "1.jsonl"), (2, "2.jsonl"), (3, "3.jsonl")):
        write_jsonl(tmp_path / name, [{**r, "step": step} for r in rows(step, 3, 4)])
    whole = read_set(tmp_path, steps=steps)
    index = index_rollouts(tmp_path, steps=steps)
    chunks = list(stream_chunks(index, chunk_groups(index.group_tokens, budget=60)))
    assert len(chunks) > 3  # the comparison crosses chunks
    streamed = [r for chunk in chunks for r in chunk.responses]
    by_key = {(r.group, r.sample): r for r in streamed}
    assert len(by_key) == len(streamed) == len(whole.responses)
    assert all(by_key[(r.group, r.sample)] == r for r in whole.responses)
    assert [r.step for r in whole.responses] == sorted(r.step for r in whole.responses)
    assert set(group_rows(whole.responses)) == set(index.group_names)
    assert "2/q0" in group_rows(
        whole.responses
    )  # q0 is in every file: qualified by the file's name
    assert whole.clamped == index.clamped and sum(whole.clamped.values()) > 0
    assert (whole.format, whole.files) == ("jsonl", index.files)


def test_the_rollout_set_holds_what_the_recipe_needs(tmp_path: Path) -> None:
    """`load_rollout_set`: the rows of `load_rollouts` (τ overridden), their groups in order of
    first appearance among the kept rows (not the index's order, which counts rows of other
    steps), each row's size (tokens, or characters of a text row) and the files' record."""
    records = [
        {"group": "a", "prompt_ids": [1], "response_ids": [2], "reward": 0.0, "step": 1},
        {"group": "b", "prompt_ids": [1], "response_ids": [2, 3], "reward": 1.0, "step": 2},
        {"group": "a", "prompt": "p", "response": "four", "reward": 1.0, "step": 2},
        {"group": "b", "prompt_ids": [1], "response_ids": [4, 5, 6], "reward": 0.0, "step": 2},
    ]
    path = write_jsonl(tmp_path / "r.jsonl", records)
    loaded = load_rollout_set(path, 0.5, steps="2")
    assert loaded.rollouts == load_rollouts(path, 0.5, steps="2")
    assert {r.temperature for r in loaded.rollouts.responses} == {0.5}
    assert loaded.groups == {"b": [0, 2], "a": [1]}
    assert index_rollouts(path, steps="2").group_names == ["a", "b"]
    assert loaded.sizes == [2, 4, 3]
    assert loaded.record == rollouts_record(loaded.rollouts)
    assert loaded.record["sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()


def test_how_rows_are_counted_follows_the_format(tmp_path: Path) -> None:
    """`Rollouts.row_word` is fixed with the format (and again when a copy changes it)."""
    rollouts = load_rollouts(write_jsonl(tmp_path / "r.jsonl", rows(0, 1, 2)))
    assert rollouts.row_word == "line"
    assert replace(rollouts, format="verl-parquet").row_word == "row"
