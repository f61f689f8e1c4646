"""Rollout files larger than memory: one pass indexes the groups, later passes hand the responses
over a chunk of groups at a time.

The index pass validates every row (the errors of `read_rollouts`, in file order) and keeps a
few numbers per row: its group, its sample number and its token count. Groups need not be
contiguous in the file. `chunk_groups` cuts the groups, in order of first appearance, into
chunks of about `CHUNK_TOKENS` response tokens; `stream_chunks` reads the file once more and
yields each chunk's `Rollouts` as soon as all of its rows have been seen, so peak memory is one
chunk (plus the rows of later chunks interleaved with it), not the file."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from otb_diag.io.rollouts import Rollouts, iter_responses

# Response tokens per chunk: bounds the per-token tables held at once (~0.1 GB at this size).
CHUNK_TOKENS = 1 << 18


@dataclass(frozen=True)
class RolloutIndex:
    """What the index pass keeps of a rollout file: one entry per row, in file order.

    row_group: `[rows]` position of the row's group in `group_names` (first-appearance order).
    row_sample: `[rows]` 0-based position of the row within its group, in file order.
    row_tokens: `[rows]` response tokens (characters of the response text for rows without ids).
    """

    path: Path
    format: str
    group_names: list[str]
    row_group: np.ndarray
    row_sample: np.ndarray
    row_tokens: np.ndarray
    has_ids: bool  # every row has prompt_ids and response_ids
    tool_output: bool  # some response holds tool output (mask 0)

    @property
    def shell(self) -> Rollouts:
        """The file's `Rollouts` with no responses: its path and format, for records."""
        return Rollouts(self.path, self.format, [])

    def group_tokens(self) -> np.ndarray:
        """`[groups]` response tokens of each group."""
        return np.bincount(self.row_group, self.row_tokens, len(self.group_names)).astype(int)


def index_rollouts(path: str | Path) -> RolloutIndex:
    """Validate every row of the file and index it (see `RolloutIndex`)."""
    shell, rows = iter_responses(path)
    position: dict[str, int] = {}
    counts: list[int] = []
    groups, samples, tokens = [], [], []
    has_ids, tool_output = True, False
    for _, r in rows:
        g = position.setdefault(r.group, len(position))
        if g == len(counts):
            counts.append(0)
        groups.append(g)
        samples.append(counts[g])
        counts[g] += 1
        has_ids = has_ids and r.response_ids is not None and r.prompt_ids is not None
        tokens.append(len(r.response_ids) if r.response_ids is not None else len(r.response or ""))
        tool_output = tool_output or (r.mask is not None and 0 in r.mask)
    return RolloutIndex(
        path=shell.path,
        format=shell.format,
        group_names=list(position),
        row_group=np.asarray(groups, dtype=np.int64),
        row_sample=np.asarray(samples, dtype=np.int64),
        row_tokens=np.asarray(tokens, dtype=np.int64),
        has_ids=has_ids,
        tool_output=tool_output,
    )


def chunk_groups(group_tokens: Sequence[int], budget: int = CHUNK_TOKENS) -> list[list[int]]:
    """Consecutive groups (positions) in chunks of at most `budget` tokens; a group larger than
    the budget is a chunk of its own."""
    chunks: list[list[int]] = []
    total = 0
    for g, n in enumerate(group_tokens):
        if not chunks or (total + n > budget and chunks[-1]):
            chunks.append([])
            total = 0
        chunks[-1].append(g)
        total += int(n)
    return chunks


def stream_chunks(index: RolloutIndex, chunks: Sequence[Sequence[int]]) -> Iterator[Rollouts]:
    """One `Rollouts` per entry of `chunks` (lists of group positions, possibly empty), in order,
    with each row's group and sample number from the index; rows of groups in no chunk are
    skipped without being decoded."""
    row_chunk = np.full(len(index.row_group), -1, dtype=np.int64)
    for c, groups in enumerate(chunks):
        row_chunk[np.isin(index.row_group, np.asarray(groups, dtype=np.int64))] = c
    expected = np.bincount(row_chunk[row_chunk >= 0], minlength=len(chunks))
    pending: dict[int, list] = {}
    ready = 0

    def complete() -> Iterator[Rollouts]:
        nonlocal ready
        while ready < len(chunks) and len(pending.get(ready, ())) == expected[ready]:
            yield replace(index.shell, responses=pending.pop(ready, []))
            ready += 1

    yield from complete()
    _, rows = iter_responses(index.path, keep=lambda i: bool(row_chunk[i] >= 0))
    for i, response in rows:
        named = replace(
            response,
            group=index.group_names[index.row_group[i]],
            sample=int(index.row_sample[i]),
        )
        pending.setdefault(int(row_chunk[i]), []).append(named)
        yield from complete()
