"""The raw records of a rollout file, read a batch at a time so that memory is set by the batch and
never by the file: JSON Lines one line at a time, Parquet through pyarrow record batches.

`open_records(path, keep)` checks the file and opens it once (`open_jsonl`, `open_parquet`): its
first row's keys (Parquet: its columns) and its records, handed over lazily from that one open
file as `(index, source_row, record)` in file order: `index` counts rows from 0, `source_row` is
what error messages name (JSONL line, 1-based; Parquet row, 0-based). Which suffix is read by
which is `READERS`. Rows that `keep` rejects are skipped before they are decoded: a rank that
measures a share of the groups, or a pass that wants one chunk, pays little for the rest of the
file."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Sequence
from itertools import chain
from pathlib import Path
from typing import Any, NamedTuple

from otb_diag.errors import InputError, json_problem
from otb_diag.io.rollouts.rows import describe

# Parquet rows decoded at once: the batch that bounds memory (responses, not tokens).
PARQUET_BATCH_ROWS = 1024

Record = tuple[int, int, dict[str, Any]]
# Which rows of a file are read: `keep[i]` for row i (rows past its end are not); None: all.
Keep = Sequence[bool] | None


class RecordFile(NamedTuple):
    """One rollout file, opened once: its reader's kind, its first row's keys (None: no rows),
    its records (lazy, from the one open file) and, for Parquet, the open file itself, from
    which a caller may read a few columns instead (`scan.py`)."""

    kind: str  # "jsonl" or "parquet": `Rollouts.format`, and whether messages say line or row
    keys: set[str] | None
    records: Iterator[Record]
    parquet: Any = None  # pyarrow.parquet.ParquetFile; None for JSON Lines


def open_records(path: Path, keep: Keep = None) -> RecordFile:
    """The file opened once (`READERS`), with only the records `keep` accepts; an unreadable or
    empty file is an `InputError`."""
    file_kind(path)  # a readable rollout file, else an `InputError`
    opened = READERS[path.suffix.lower()].open(path, keep)
    if opened.keys is None:
        raise InputError("the file has no rows", path=path, hint="Expected one row per response.")
    return opened


def kept(keep: Keep, index: int) -> bool:
    """Whether row `index` is read (`Keep`)."""
    return keep is None or (index < len(keep) and bool(keep[index]))


class _Line(NamedTuple):
    """A non-blank line of a JSON Lines file, not yet decoded."""

    index: int  # among the non-blank lines, from 0
    number: int  # 1-based, blank lines counted: what messages name
    start: int  # its byte offset, for a message about a bad byte
    raw: bytes


def _lines(path: Path) -> Iterator[_Line]:
    """Lines split on "\\n" only (splitlines() would also break inside a string at U+2028);
    the file is opened when the first line is asked for."""
    index = 0
    offset = 0
    with path.open("rb") as f:
        for number, raw in enumerate(f, start=1):
            start, offset = offset, offset + len(raw)
            if raw.strip():
                yield _Line(index, number, start, raw)
                index += 1


def _decoded(path: Path, line: _Line) -> Record:
    """One line as a record: UTF-8 text holding one JSON object, else an `InputError`."""
    try:
        text = line.raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise InputError(
            f"not UTF-8 text ({err.reason} at byte {line.start + err.start})",
            path=path,
            line=line.number,
        ) from None
    try:
        record = json.loads(text)
    except json.JSONDecodeError as err:
        raise InputError(
            f"malformed JSON: {json_problem(err)}.",
            path=path,
            line=line.number,
            hint="Each line must hold one JSON object (JSON Lines).",
        ) from None
    if not isinstance(record, dict):
        raise InputError(
            f"expected a JSON object, got {describe(record)}.", path=path, line=line.number
        )
    return line.index, line.number, record


def jsonl_records(path: Path, keep: Keep) -> Iterator[Record]:
    """The records of a JSON Lines file that `keep` accepts, decoded as they are read."""
    return (_decoded(path, line) for line in _lines(path) if kept(keep, line.index))


def open_jsonl(path: Path, keep: Keep) -> RecordFile:
    """A JSON Lines file opened once: its first line decoded for the keys (a bad first line is
    an error now), the rest read on demand from the same open file."""
    lines = _lines(path)
    first = next(lines, None)
    if first is None:
        return RecordFile("jsonl", None, iter(()))
    head = _decoded(path, first)
    rest = (_decoded(path, line) for line in lines if kept(keep, line.index))
    return RecordFile("jsonl", set(head[2]), chain([head] if kept(keep, 0) else [], rest))


def open_parquet(path: Path, keep: Keep) -> RecordFile:
    """A Parquet file opened once: the Arrow schema's names are its keys (the top-level columns;
    the Parquet schema's are leaves), its records read a batch at a time."""
    parquet = parquet_file(path)
    keys = set(parquet.schema_arrow.names) if parquet.metadata.num_rows else None
    return RecordFile("parquet", keys, _parquet_records(path, parquet, keep), parquet)


def _parquet_records(path: Path, parquet: Any, keep: Keep) -> Iterator[Record]:
    """Record batches of `PARQUET_BATCH_ROWS` of the open file `parquet`; nulls become None, so
    they read as absent."""
    import pyarrow as pa

    start = 0
    try:
        batches = parquet.iter_batches(batch_size=PARQUET_BATCH_ROWS, use_threads=False)
        for batch in batches:
            rows = range(start, start + batch.num_rows)
            start += batch.num_rows
            wanted = [i for i in rows if kept(keep, i)]
            if not wanted:
                continue
            if len(wanted) < batch.num_rows:
                batch = batch.take(pa.array([i - rows.start for i in wanted]))
            for i, record in zip(wanted, batch.to_pylist(), strict=True):
                yield i, i, record
    except (pa.ArrowException, OSError) as err:
        raise InputError(f"not a readable Parquet file ({err})", path=path) from None


def parquet_file(path: Path):  # -> pyarrow.parquet.ParquetFile
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        # Without pre-buffering and threads pyarrow reads one batch at a time; with them it read
        # the row groups ahead, and its pool grew with the file (156 MB for 6 M tokens).
        return pq.ParquetFile(path, pre_buffer=False)
    except (pa.ArrowException, OSError) as err:
        raise InputError(f"not a readable Parquet file ({err})", path=path) from None


class RolloutReader(NamedTuple):
    """How one kind of rollout file is read."""

    kind: str  # "jsonl" or "parquet"
    open: Callable[[Path, Keep], RecordFile]


_JSONL = RolloutReader("jsonl", open_jsonl)
_PARQUET = RolloutReader("parquet", open_parquet)

# File suffix (lower case) -> its reader: the one list of readable rollout files. `sources.py`
# picks the files of a directory or a glob by these suffixes; a new format is one entry here.
READERS: dict[str, RolloutReader] = {".jsonl": _JSONL, ".json": _JSONL, ".parquet": _PARQUET}


def file_kind(path: Path) -> str:
    """The reader's kind ("jsonl" or "parquet") for a readable rollout file, else `InputError`."""
    reader = READERS.get(path.suffix.lower())
    if reader is None:
        raise InputError(
            f"unknown rollout file type '{path.suffix}'",
            path=path,
            hint="Use .jsonl (or .json, read as JSON Lines) or .parquet.",
        )
    if not path.exists():
        raise InputError("file does not exist", path=path)
    if not path.is_file():
        raise InputError("not a file", path=path)
    return reader.kind
