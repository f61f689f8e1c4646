"""tokens.parquet written a chunk at a time and one group read back from its chunk
(`io/token_file.py`): the same rows as filtering the whole file, over several steps too."""

from __future__ import annotations

import contextlib
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.parquet as pq

from otb_diag.io.token_file import TokenWriter, read_group


def chunk(groups: list[str], step: int, rng: np.random.Generator) -> pd.DataFrame:
    sizes = rng.integers(1, 9, len(groups))
    return pd.DataFrame(
        {
            "group": np.repeat(groups, sizes),
            "t": np.concatenate([np.arange(n) for n in sizes]),
            "w": rng.random(int(sizes.sum())).astype(np.float32),
            "step": step,
        }
    )


def test_a_group_read_from_its_chunk_equals_the_filtered_file(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    plan = [["a", "b"], ["c"], ["d", "e", "f"]]  # three chunks, written for steps 5 and 10
    path = tmp_path / "tokens.parquet"
    with contextlib.ExitStack() as stack:
        writer = TokenWriter(path, stack)
        for step in (5, 10):
            for groups in plan:
                writer.write(chunk(groups, step, rng))
        writer.close()
        assert writer.path != path and not path.exists()  # renamed when the stack closes
    assert pq.ParquetFile(path).num_row_groups == 6
    assert [n for _, n in writer.chunks] == [len(t) for t in _chunks(path)]
    for c, groups in enumerate(plan):
        for group in groups:
            got = read_group(path, group, writer.chunks[c - len(plan)])  # the last step's
            filters = [("group", "==", group), ("step", "==", 10)]
            expected = pq.read_table(path, filters=filters).to_pandas()
            assert len(got) > 0
            pd.testing.assert_frame_equal(got, expected)
            first = read_group(path, group, writer.chunks[c])  # step 5's chunk
            assert set(first["step"]) == {5}


def _chunks(path: Path) -> list[pd.DataFrame]:
    file = pq.ParquetFile(path)
    return [file.read_row_group(i).to_pandas() for i in range(file.num_row_groups)]


def test_a_writer_that_never_writes_leaves_nothing(tmp_path: Path) -> None:
    """What a rank other than 0 holds: it measures, rank 0 alone writes."""
    with contextlib.ExitStack() as stack:
        writer = TokenWriter(tmp_path / "tokens.parquet", stack)
        writer.close()
    assert writer.chunks == [] and writer.path is None and not list(tmp_path.iterdir())
