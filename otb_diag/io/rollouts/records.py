"""The raw records of a rollout file, read a batch at a time so that memory is set by the batch and
never by the file: JSON Lines one line at a time, Parquet through pyarrow record batches.

`jsonl_records(path, keep)` and `parquet_records(path, keep)` yield `(index, source_row, record)` in
file order: `index` counts rows from 0, `source_row` is what error messages name (JSONL line,
1-based; Parquet row, 0-based). Which suffix is read by which is `readers.py:READERS`.
Rows that `keep(index)` rejects are skipped before they are decoded: a rank that measures a share
of the groups, or a pass that wants one chunk, pays little for the rest of the file."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from otb_diag.errors import InputError
from otb_diag.io.rollouts.rows import describe

# Parquet rows decoded at once: the batch that bounds memory (responses, not tokens).
PARQUET_BATCH_ROWS = 1024

Record = tuple[int, int, dict[str, Any]]


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


def parquet_records(path: Path, keep: Callable[[int], bool] | None) -> Iterator[Record]:
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
