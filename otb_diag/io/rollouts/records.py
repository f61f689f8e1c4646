"""The raw records of a rollout file, read a batch at a time so that memory is set by the batch and
never by the file: JSON Lines one line at a time, Parquet through pyarrow record batches.

`open_records(path, keep)` checks the file, reads its first row's keys (Parquet: its columns) and
hands over its records lazily. `jsonl_records(path, keep)` and `_parquet_records(path, keep)` yield
`(index, source_row, record)` in file order: `index` counts rows from 0, `source_row` is what
error messages name (JSONL line, 1-based; Parquet row, 0-based). Which suffix is read by which is
`READERS`. Rows that `keep(index)` rejects are skipped before they are decoded: a rank that
measures a share of the groups, or a pass that wants one chunk, pays little for the rest of the
file."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, NamedTuple

from otb_diag.errors import InputError
from otb_diag.io.rollouts.rows import describe

# Parquet rows decoded at once: the batch that bounds memory (responses, not tokens).
PARQUET_BATCH_ROWS = 1024

Record = tuple[int, int, dict[str, Any]]


class RecordFile(NamedTuple):
    """One rollout file opened: its reader's kind, its first row's keys, its records (lazy)."""

    kind: str  # "jsonl" or "parquet": `Rollouts.format`, and whether messages say line or row
    keys: set[str]
    records: Iterator[Record]


def open_records(path: Path, keep: Callable[[int], bool] | None = None) -> RecordFile:
    """The file's kind and first row's keys, and its records that `keep` accepts (all when None);
    an unreadable or empty file is an `InputError`."""
    kind = file_kind(path)
    keys = first_keys(path, kind)
    if keys is None:
        raise InputError("the file has no rows", path=path, hint="Expected one row per response.")
    return RecordFile(kind, keys, READERS[path.suffix.lower()].records(path, keep))


def first_keys(path: Path, kind: str) -> set[str] | None:
    """The keys of the first row (Parquet: the columns), or None when the file has no rows."""
    if kind == "parquet":
        parquet = parquet_file(path)
        # The Arrow schema's names are the top-level columns (the Parquet schema's are leaves).
        return set(parquet.schema_arrow.names) if parquet.metadata.num_rows else None
    first = next(jsonl_records(path, None), None)
    return None if first is None else set(first[2])


def jsonl_records(path: Path, keep: Callable[[int], bool] | None) -> Iterator[Record]:
    """Lines split on "\\n" only (splitlines() would also break inside a string at U+2028)."""
    index = 0
    offset = 0
    with path.open("rb") as f:
        for number, raw in enumerate(f, start=1):
            start, offset = offset, offset + len(raw)
            if not raw.strip():
                continue
            index += 1
            if keep is not None and not keep(index - 1):
                continue
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as err:
                raise InputError(
                    f"not UTF-8 text ({err.reason} at byte {start + err.start})",
                    path=path,
                    line=number,
                ) from None
            try:
                record = json.loads(line)
            except json.JSONDecodeError as err:
                raise InputError(
                    f"malformed JSON: {err.msg} at column {err.colno}.",
                    path=path,
                    line=number,
                    hint="Each line must hold one JSON object (JSON Lines).",
                ) from None
            if not isinstance(record, dict):
                raise InputError(
                    f"expected a JSON object, got {describe(record)}.", path=path, line=number
                )
            yield index - 1, number, record


def _parquet_records(path: Path, keep: Callable[[int], bool] | None) -> Iterator[Record]:
    """Record batches of `PARQUET_BATCH_ROWS`; nulls become None, so they read as absent."""
    import pyarrow as pa

    start = 0
    try:
        batches = parquet_file(path).iter_batches(batch_size=PARQUET_BATCH_ROWS, use_threads=False)
        for batch in batches:
            rows = range(start, start + batch.num_rows)
            start += batch.num_rows
            wanted = [i for i in rows if keep is None or keep(i)]
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
    records: Callable[[Path, Callable[[int], bool] | None], Iterator[Record]]


_JSONL = RolloutReader("jsonl", jsonl_records)
_PARQUET = RolloutReader("parquet", _parquet_records)

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
