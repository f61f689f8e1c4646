"""The one way in for rollouts: one pass indexes the groups, later passes hand the responses over
a chunk of groups at a time; a command that needs every row at once reads the index pass's rows.

The rollouts are a set of files (`sources.expand_rollouts`: a file, a directory or a
glob), read in step order. The index pass (`index_rollouts`) validates every row (in file
order; or, for a caller that validates while reading, only reads a few columns of a plain
Parquet set: `scan.py`), applies `--steps`, and keeps a few numbers per row: its file, its
group, its sample number and its token count. Groups need not be contiguous in a file; a group
id used in more than one file is qualified by its file's name (`12/g0`). Each pass opens each
file once.
Given chunks of groups (`otb_diag/io/loading.py:chunk_groups` cuts them), `stream_chunks` reads
the files once more and yields each chunk's `Rollouts` as soon as all of its rows have been seen,
so peak memory is one chunk (plus the rows of later chunks interleaved with it), not the set
(`energy`, through `otb_diag/io/loading.py:RolloutStream`). `read_set` is the whole
set as one `Rollouts`, the rows the index pass decoded named as the index names them
(`variance-compare`, the API, `otb_diag/io/loading.py:load_rollouts`); `rollouts inspect` sees
each row as the index pass reads it."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from otb_diag.io.rollouts.probability_checks import CLAMPED_FIELDS
from otb_diag.io.rollouts.readers import Rollouts, open_rollouts
from otb_diag.io.rollouts.rows import Response
from otb_diag.io.rollouts.scan import OnRow, scan_set


@dataclass(frozen=True)
class RolloutIndex:
    """What the index pass keeps of a rollout set: one entry per kept row, in set order.

    row_file: `[rows]` position of the row's file in `files`.
    row_local: `[rows]` the row's index among all rows of its file (`open_rollouts`' index).
    row_group: `[rows]` position of the row's group in `group_names` (first-appearance order).
    row_sample: `[rows]` 0-based position of the row within its group, in file order.
    row_tokens: `[rows]` response tokens (characters of the response text for rows without ids).
    group_tokens: `[groups]` response tokens of each group (the sum of its rows' `row_tokens`).
    """

    path: Path
    format: str
    files: list[Path]
    group_names: list[str]
    row_file: np.ndarray
    row_local: np.ndarray
    row_group: np.ndarray
    row_sample: np.ndarray
    row_tokens: np.ndarray
    group_tokens: np.ndarray
    has_ids: bool  # every row has prompt_ids and response_ids
    tool_output: bool  # some response holds tool output (mask 0)
    # Logged values clamped onto a consistency rule, every file; None when the index pass did
    # not decode the rows (`stream_chunks` then counts them, chunk by chunk).
    clamped: dict[str, int] | None
    reward_columns: list[str] | None = None

    @property
    def shell(self) -> Rollouts:
        """The set's `Rollouts` with no responses: path, format, files and clamped counts."""
        clamped = dict.fromkeys(CLAMPED_FIELDS, 0) if self.clamped is None else dict(self.clamped)
        return Rollouts(self.path, self.format, [], clamped=clamped, files=self.files)


def index_rollouts(
    spec: str | Path,
    *,
    steps: str | None = None,
    reward_columns: list[str] | None = None,
    validate: bool = True,
    on_row: OnRow | None = None,
) -> RolloutIndex:
    """Validate every row of the set `spec` names and index the rows whose step lies in
    `steps` ("A-B" or "A"; all rows when None; see `RolloutIndex`); `on_row((file position,
    file, row))` sees each kept row as it is read, in set order (before its group is qualified
    and its sample numbered: `named`).

    `validate=False` is for a caller that decodes every row later (`stream_chunks` validates
    each row it reads): without `steps` and `on_row`, a plain Parquet set is then indexed from
    four of its columns (`scan.scan_columns`), and the clamped round-off is left to that pass
    (`clamped` is None)."""
    scan = scan_set(spec, steps, reward_columns, validate=validate, on_row=on_row)
    files = scan.files
    position: dict[tuple[int, str], int] = {}  # (file, group id) -> group position
    counts: list[int] = []
    kept: list[tuple[int, int, int, int, int]] = []  # file, local, group, sample, tokens
    for f, local, group, size, wanted in scan.rows:
        g = position.setdefault((f, group), len(position))
        if g == len(counts):
            counts.append(0)
        counts[g] += 1  # samples are numbered before the --steps filter, as read_rollouts does
        if wanted:
            kept.append((f, local, g, counts[g] - 1, size))
    table = np.asarray(kept, dtype=np.int64).reshape(-1, 5)
    used = np.unique(table[:, 2])  # groups with a kept row, renumbered in order
    renumber = np.full(len(position), -1, dtype=np.int64)
    renumber[used] = np.arange(len(used))
    row_group = renumber[table[:, 2]]
    return RolloutIndex(
        path=Path(spec),
        format=scan.formats.pop() if len(scan.formats) == 1 else "mixed",
        files=files,
        group_names=[
            n for k, n in enumerate(group_names(list(position), files)) if renumber[k] >= 0
        ],
        row_file=table[:, 0],
        row_local=table[:, 1],
        row_group=row_group,
        row_sample=table[:, 3],
        row_tokens=table[:, 4],
        group_tokens=np.bincount(row_group, table[:, 4], len(used)).astype(int),
        has_ids=scan.has_ids,
        tool_output=scan.tool_output,
        clamped=scan.clamped,
        reward_columns=reward_columns,
    )


def read_set(
    spec: str | Path, *, steps: str | None = None, reward_columns: list[str] | None = None
) -> Rollouts:
    """Every kept row of the set `spec` names (see `index_rollouts`) as one `Rollouts`, in set
    order, decoded once: the rows of the index pass, named by the index. `clamped` counts the
    values clamped in every row of the set."""
    rows: list[tuple[int, Rollouts, Response]] = []
    index = index_rollouts(spec, steps=steps, reward_columns=reward_columns, on_row=rows.append)
    return replace(index.shell, responses=[named(index, i, r) for i, (_, _, r) in enumerate(rows)])


def named(index: RolloutIndex, i: int, response: Response) -> Response:
    """Row `i` of the index with its group's name and its sample number in the group."""
    return replace(
        response, group=index.group_names[index.row_group[i]], sample=int(index.row_sample[i])
    )


def group_names(keys: list[tuple[int, str]], files: list[Path]) -> list[str]:
    """The names of groups keyed by `(file position, group id)`: the id, qualified by its
    file's name (`12/g0`) when the id is used in more than one file."""
    owners = Counter(group for _, group in keys)
    return [f"{files[f].stem}/{group}" if owners[group] > 1 else group for (f, group) in keys]


def stream_chunks(index: RolloutIndex, chunks: Sequence[Sequence[int]]) -> Iterator[Rollouts]:
    """One `Rollouts` per entry of `chunks` (lists of group positions, possibly empty), in order,
    with each row's group and sample number from the index, and in `clamped` the logged values
    clamped in the chunk's own rows; rows of groups in no chunk are skipped without being
    decoded."""
    row_chunk = np.full(len(index.row_group), -1, dtype=np.int64)
    for c, groups in enumerate(chunks):
        row_chunk[np.isin(index.row_group, np.asarray(groups, dtype=np.int64))] = c
    expected = np.bincount(row_chunk[row_chunk >= 0], minlength=len(chunks))
    pending: dict[int, list] = {}
    clamped: dict[int, Counter[str]] = {}
    ready = 0

    def complete() -> Iterator[Rollouts]:
        nonlocal ready
        while ready < len(chunks) and len(pending.get(ready, ())) == expected[ready]:
            counts = {k: clamped.get(ready, Counter())[k] for k in CLAMPED_FIELDS}
            yield replace(index.shell, responses=pending.pop(ready, []), clamped=counts)
            clamped.pop(ready, None)
            ready += 1

    yield from complete()
    for f, path in enumerate(index.files):
        mine = index.row_file == f
        if not (row_chunk[mine] >= 0).any():
            continue
        local = np.full(int(index.row_local[mine].max()) + 1, -1, dtype=np.int64)
        local[index.row_local[mine]] = np.flatnonzero(mine)  # file row -> index row
        keep = np.zeros(len(local), dtype=bool)  # `[file rows]` in some chunk
        keep[local >= 0] = row_chunk[local[local >= 0]] >= 0
        shell, rows, _ = open_rollouts(path, keep, reward_columns=index.reward_columns)
        seen = Counter(shell.clamped)  # the file's clamped counts before this row
        for j, response in rows:
            i = int(local[j])
            clamped.setdefault(int(row_chunk[i]), Counter()).update(Counter(shell.clamped) - seen)
            seen = Counter(shell.clamped)
            pending.setdefault(int(row_chunk[i]), []).append(named(index, i, response))
            yield from complete()
