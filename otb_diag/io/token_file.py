"""`tokens.parquet` of `otb-diag energy`, written a chunk at a time (one row group or more per
chunk, into a temporary path renamed at the end) and read back a chunk at a time, so that
neither side holds more than a chunk's tokens."""

from __future__ import annotations

import contextlib
from pathlib import Path

import numpy as np
import pandas as pd

from otb_diag.io.atomic import atomic_path


class TokenWriter:
    """Appends each chunk's per-token table to `dest`, atomically: the first write opens a
    temporary file beside it (`otb_diag/io/atomic.py:atomic_path`, entered on `stack`, which
    renames it onto `dest` when it closes without an error), so a writer that never writes
    leaves nothing. `chunks[k]` is the `(first row, rows)` of the k-th table written; `path` is
    the file being written (None before the first write)."""

    def __init__(self, dest: Path, stack: contextlib.ExitStack) -> None:
        self.dest = dest
        self.path: Path | None = None
        self.chunks: list[tuple[int, int]] = []
        self._stack = stack
        self._writer = None

    def write(self, tokens: pd.DataFrame) -> None:
        import pyarrow as pa
        import pyarrow.parquet as pq

        if self._writer is None:
            self.path = self._stack.enter_context(atomic_path(self.dest))
            table = pa.Table.from_pandas(tokens, preserve_index=False)
            # Dictionary pages for the columns with few distinct values (group, token, t, ...);
            # float columns rarely repeat, and trying them costs half the writing time.
            repeating = [f.name for f in table.schema if not pa.types.is_floating(f.type)]
            self._writer = pq.ParquetWriter(self.path, table.schema, use_dictionary=repeating)
        else:
            table = pa.Table.from_pandas(tokens, schema=self._writer.schema, preserve_index=False)
        self._writer.write_table(table)
        start = sum(self.chunks[-1]) if self.chunks else 0
        self.chunks.append((start, len(tokens)))

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None


def read_group(path: Path, group: str, chunk: tuple[int, int]) -> pd.DataFrame:
    """The rows of `group` among the rows `chunk = (first row, rows)` of a written file (the
    chunk that holds the group), read from the row groups that hold them: what
    `pq.read_table(path, filters=[("group", "==", group)])` gives for those rows, without
    reading, or holding, the rest of the file."""
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    start, rows = chunk
    with pq.ParquetFile(path) as file:
        sizes = [file.metadata.row_group(i).num_rows for i in range(file.num_row_groups)]
        bounds = np.cumsum([0, *sizes])
        wanted = [i for i, n in enumerate(sizes) if n and bounds[i] < start + rows]
        wanted = [i for i in wanted if bounds[i + 1] > start]
        if not wanted:
            return file.schema_arrow.empty_table().to_pandas()
        table = file.read_row_groups(wanted).slice(start - int(bounds[wanted[0]]), rows)
    return table.filter(pc.equal(table["group"], group)).to_pandas()
