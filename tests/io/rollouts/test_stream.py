"""The index pass of streamed rollouts (`io/rollouts/stream.py`, `io/rollouts/scan.py`): the
column scan of a plain Parquet set indexes exactly what the row scan does, defers to it on
anything it cannot settle, and `energy` over many chunks of such a set writes what it writes for
the same rows as JSON Lines (which the row scan reads), clamped round-off counts included; a
bad row is still named, with nothing written; each pass opens each file once."""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import fields
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from otb_diag.errors import InputError
from otb_diag.io.loading import chunk_groups
from otb_diag.io.rollouts.probability_checks import TOLERANCE
from otb_diag.io.rollouts.readers import open_rollouts
from otb_diag.io.rollouts.scan import scan_columns
from otb_diag.io.rollouts.stream import index_rollouts, stream_chunks
from otb_diag.pipelines.energy import measure as energy_stream
from otb_diag.pipelines.energy.recipe import EnergySettings, run_energy
from otb_diag.pipelines.inputs import EnergyInputs
from otb_diag.pipelines.results.energy import EnergyResult


def rows(seed: int, groups: int, per_group: int, *, text_every: int = 0) -> list[dict]:
    """Model-free rows whose groups interleave (row k belongs to group k mod `groups`), with
    round-off to clamp on some tokens and tool output (mask 0) on others."""
    rng = np.random.default_rng(seed)
    out = []
    for k in range(groups * per_group):
        n = int(rng.integers(1, 40))
        logprobs = (-rng.exponential(0.7, n)).tolist()
        p = np.exp(logprobs)
        sum_pi2 = np.minimum(1.0, p**2 + 0.2 * (1 - p) ** 2).tolist()
        if k % 5 == 1:  # bf16 round-off, clamped and counted
            logprobs[0], sum_pi2[0] = TOLERANCE / 2, 1 + TOLERANCE / 2
        row = {
            "group": f"q{k % groups}",
            "prompt_ids": rng.integers(0, 50, int(rng.integers(1, 6))).tolist(),
            "response_ids": rng.integers(0, 50, n).tolist(),
            "reward": float(rng.integers(0, 2)),
            "logprobs": logprobs,
            "sum_pi2": sum_pi2,
            "mask": [0 if k % 7 == 3 and t == 0 and n > 1 else 1 for t in range(n)],
        }
        if text_every:  # every text_every-th row has text only, counted in characters
            text = k % text_every == 0
            row["response"] = "x" * n if text else None
            row["response_ids"] = None if text else row["response_ids"]
        out.append(row)
    return out


def write_parquet(path: Path, records: list[dict], batch: int = 7) -> Path:
    """Several row groups, so that groups run across them."""
    table = pa.Table.from_pylist(records)
    pq.write_table(table, path, row_group_size=batch)
    return path


def write_jsonl(path: Path, records: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return path


def assert_same_index(spec: Path) -> None:
    full = index_rollouts(spec)
    light = index_rollouts(spec, validate=False)
    assert light.clamped is None and full.clamped is not None
    for f in fields(full):
        a, b = getattr(full, f.name), getattr(light, f.name)
        if f.name == "clamped":
            continue
        if isinstance(a, np.ndarray):
            np.testing.assert_array_equal(a, b, err_msg=f.name)
        else:
            assert a == b, f.name


def columns_settle(path: Path) -> bool:
    """Whether the index pass may read `path` from its columns: a plain Parquet file
    (`open_rollouts`' `plain_parquet`) whose columns settle every row (`scan_columns`)."""
    plain = open_rollouts(path).plain_parquet
    return plain is not None and scan_columns(0, plain) is not None


def test_column_scan_indexes_what_the_row_scan_does(tmp_path: Path) -> None:
    """Interleaved groups, a group id used in two files (qualified by the file), integer ids
    spelled `uid`, text-only rows, tool output."""
    folder = tmp_path / "dumps"
    folder.mkdir()
    write_parquet(folder / "1.parquet", rows(0, 4, 5))
    write_parquet(folder / "2.parquet", rows(1, 3, 4, text_every=4))
    renamed = [{("uid" if k == "group" else k): v for k, v in r.items()} for r in rows(2, 2, 3)]
    for r in renamed:
        r["uid"] = int(r["uid"][1:])
    write_parquet(folder / "3.parquet", renamed)
    assert all(columns_settle(p) for p in folder.iterdir())  # the column scan is taken
    assert_same_index(folder)
    assert not index_rollouts(folder, validate=False).has_ids  # the text-only rows
    assert index_rollouts(folder / "1.parquet", validate=False).tool_output


@pytest.mark.parametrize(
    ("edit", "where"),
    [
        (lambda r, k: r.update(group=None) if k == 2 else None, "row 2"),  # missing: named
        (lambda r, k: r.update(group=k % 2 == 0), "row 0"),  # a bool column: not an id
        (lambda r, k: r.update(group=k / 2), "row 0"),
        (lambda r, k: r.pop("group"), "row 0"),
    ],
    ids=["null-group", "bool-group", "float-group", "no-group-column"],
)
def test_column_scan_defers_to_the_row_scan(edit, where: str, tmp_path: Path) -> None:
    records = rows(0, 2, 3)
    for k, r in enumerate(records):
        edit(r, k)
    path = write_parquet(tmp_path / "r.parquet", records)
    assert not columns_settle(path)
    with pytest.raises(InputError) as full:
        index_rollouts(path)
    with pytest.raises(InputError) as light:
        index_rollouts(path, validate=False)
    assert str(light.value) == str(full.value)
    assert f"{where}, field" in str(full.value)


def test_column_scan_leaves_json_lines_and_trainer_dumps_to_the_row_scan(tmp_path: Path) -> None:
    assert open_rollouts(write_jsonl(tmp_path / "r.jsonl", rows(0, 2, 2))).plain_parquet is None
    verl = [
        {"input": "a", "output": "b", "score": 1.0, "step": 1, "uid": "u"},
        {"input": "a", "output": "c", "score": 0.0, "step": 1, "uid": "u"},
    ]
    assert open_rollouts(write_parquet(tmp_path / "v.parquet", verl)).plain_parquet is None


def run(rollouts: Path, out: Path) -> EnergyResult:
    given = EnergyInputs(rollouts=rollouts, model_free=True)
    result = run_energy(given, out, EnergySettings(), progress=False)
    assert result is not None
    return result


@pytest.mark.slow  # runs a command end to end (a real run: seconds)
def test_energy_over_chunks_of_parquet_equals_jsonl(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Chunks of ~60 tokens over interleaved groups: each chunk's rows are gathered from all
    over the file; the clamped counts come from the reading pass (Parquet) or the index pass
    (JSON Lines) and agree."""
    monkeypatch.setattr(energy_stream, "CHUNK_TOKENS", 60)
    records = rows(3, 6, 5)
    jsonl = run(write_jsonl(tmp_path / "r.jsonl", records), tmp_path / "a")
    parquet = run(write_parquet(tmp_path / "r.parquet", records), tmp_path / "b")
    assert parquet.consistency == jsonl.consistency
    clamped = parquet.consistency.clamped
    assert clamped == {"logprobs": 6, "sum_pi2": 6}  # rows 1, 6, 11, ... of 30
    assert parquet.energy == jsonl.energy and parquet.proxies == jsonl.proxies
    pd.testing.assert_frame_equal(
        pd.read_parquet(tmp_path / "a" / "tokens.parquet"),
        pd.read_parquet(tmp_path / "b" / "tokens.parquet"),
    )
    for name in ("sequences.csv", "groups.csv"):
        assert (tmp_path / "a" / name).read_text() == (tmp_path / "b" / name).read_text()


def test_a_bad_row_found_while_reading_is_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The column scan does not decode rows: a value beyond the tolerance in the last chunk is
    found by the reading pass, named as the row scan names it, and nothing is written."""
    monkeypatch.setattr(energy_stream, "CHUNK_TOKENS", 60)
    records = rows(4, 4, 4)
    records[-2]["sum_pi2"][0] = 1.5
    path = write_parquet(tmp_path / "r.parquet", records)
    with pytest.raises(InputError) as err:
        index_rollouts(path)  # the row scan's message
    out = tmp_path / "out"
    with pytest.raises(InputError) as streamed:
        run(path, out)
    assert str(streamed.value) == str(err.value)
    assert "row 14" in str(err.value) and "sum_pi2" in str(err.value)
    assert not out.exists()


def count_opens(monkeypatch: pytest.MonkeyPatch) -> Counter[str]:
    """From now on, how many times each file is opened for reading rows (by name): JSON Lines
    through `Path.open`, Parquet through pyarrow's `ParquetFile`."""
    opened: Counter[str] = Counter()
    path_open, parquet_file = Path.open, pq.ParquetFile

    def counted_open(self: Path, *args, **kwargs):
        opened[self.name] += 1
        return path_open(self, *args, **kwargs)

    def counted_parquet(source, *args, **kwargs):
        opened[Path(source).name] += 1
        return parquet_file(source, *args, **kwargs)

    monkeypatch.setattr(Path, "open", counted_open)
    monkeypatch.setattr(pq, "ParquetFile", counted_parquet)
    return opened


@pytest.mark.parametrize(
    ("kind", "validate"),
    [("parquet", False), ("parquet", True), ("both", False), ("both", True)],
    ids=["parquet-columns", "parquet-rows", "both-columns", "both-rows"],
)
@pytest.mark.slow  # runs a command end to end (a real run: seconds)
def test_each_file_is_opened_once_per_pass(
    kind: str, validate: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A directory of two files (two Parquet files, or JSON Lines and Parquet): the index pass,
    by rows or from the columns, opens each file once, and so does each pass that reads the
    chunks; `energy --model-free` (one such pass) opens each twice."""
    folder = tmp_path / "dumps"
    folder.mkdir()
    first = folder / ("1.parquet" if kind == "parquet" else "1.jsonl")
    (write_parquet if kind == "parquet" else write_jsonl)(first, rows(0, 3, 4))
    write_parquet(folder / "2.parquet", rows(1, 3, 4))
    names = {first.name: 1, "2.parquet": 1}
    opened = count_opens(monkeypatch)
    index = index_rollouts(folder, validate=validate)
    assert opened == names
    for _ in range(2):
        opened.clear()
        chunks = list(stream_chunks(index, chunk_groups(index.group_tokens, budget=40)))
        assert len(chunks) > 2 and opened == names
    opened.clear()
    monkeypatch.setattr(energy_stream, "CHUNK_TOKENS", 40)
    run(folder, tmp_path / "out")
    assert {name: opened[name] for name in names} == {name: 2 for name in names}
