"""From the user's paths to the rollouts a command measures: read and validate the set, apply
`--temperature`, and hand over in one object what measuring it needs, so that a recipe following
`rollouts_path` goes down through io/ once (ARCHITECTURE.md, "Data flow"): the whole set
(`RolloutSet`: the streaming index's whole-set view, the rows, their groups and sizes, their
record for summary.json; `variance-compare`), or the set a chunk of groups at a time
(`RolloutStream`: the index, its chunks, their record; `energy`). The checkpoint side (tokenize,
check, batch) is `otb_diag/io/batches.py`."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from itertools import accumulate
from pathlib import Path
from typing import Any

from otb_diag.errors import InputError
from otb_diag.io.load_options import LoadOptions as LoadOptions  # re-exported
from otb_diag.io.provenance import file_sha256
from otb_diag.io.rollouts.readers import Rollouts
from otb_diag.io.rollouts.rows import Response
from otb_diag.io.rollouts.scan import response_size
from otb_diag.io.rollouts.stream import RolloutIndex, index_rollouts, read_set, stream_chunks

# Response tokens per chunk: bounds the per-token tables held at once (~0.1 GB at this size).
CHUNK_TOKENS = 1 << 18


@dataclass(frozen=True)
class RolloutSet:
    """What the load hands a recipe that measures the whole set.

    rollouts: every kept row, in set order (τ overridden when asked).
    groups: group name -> indices into `rollouts.responses`, in order of first appearance.
    sizes: `[rows]` each response's tokens (characters of its text when it has no ids yet).
    record: path, format and hash of the files (`rollouts_record`), for summary.json.
    with_signal: per group, in `groups`' order, whether its rewards carry a signal
    (`groups_with_signal`).
    """

    rollouts: Rollouts
    groups: dict[str, list[int]]
    sizes: list[int]
    record: dict[str, Any]
    with_signal: list[bool]


def load_rollout_set(
    path: Path,
    temperature: float | None = None,
    *,
    steps: str | None = None,
    reward_columns: list[str] | None = None,
) -> RolloutSet:
    """`load_rollouts` (same arguments), with the rows' groups, sizes and record."""
    rollouts = load_rollouts(path, temperature, steps=steps, reward_columns=reward_columns)
    groups = group_rows(rollouts.responses)
    return RolloutSet(
        rollouts=rollouts,
        groups=groups,
        sizes=[response_size(r) for r in rollouts.responses],
        record=rollouts_record(rollouts),
        with_signal=groups_with_signal(rollouts.responses, groups),
    )


def groups_with_signal(responses: list[Response], groups: dict[str, list[int]]) -> list[bool]:
    """Per group of `groups` (name -> indices into `responses`), whether its rewards carry a
    signal: whether its members' returns take more than one value (`_return_values`). Where
    they are all one value c, every group baseline is c and every advantage `G_t − c` is 0: the
    group tells no baseline from another. Read off the rows alone, before any model is
    loaded."""
    return [
        len(set().union(*(_return_values(responses[i]) for i in rows))) > 1
        for rows in groups.values()
    ]


def _return_values(r: Response) -> set[float]:
    """The values a response's returns `G_t = Σ_{k≥t} mask_k r_k` take at its generated tokens,
    and `G_0` (the `R_i` a group baseline averages): with token rewards, their suffix sums over
    the mask-1 tokens; with an outcome reward R placed on the last generated token
    (`maths/returns.py:outcome_token_rewards`), R; a response with no generated token, 0."""
    if r.token_rewards is not None:
        mask = r.mask or [1] * len(r.token_rewards)  # rows are checked: one entry a token
        kept = [x * m for x, m in zip(r.token_rewards, mask, strict=True)]
        suffix = list(accumulate(reversed(kept)))[::-1]  # G_t, t = 0..T-1
        generated = [g for g, m in zip(suffix, mask, strict=True) if m]
        return {suffix[0] if suffix else 0.0, *generated}
    length = len(r.response_ids) if r.response_ids is not None else len(r.response or "")
    generated = any(r.mask) if r.mask is not None else length > 0
    return {float(r.reward or 0.0) if generated else 0.0}


@dataclass(frozen=True)
class RolloutStream:
    """What the load hands a recipe that measures the set a chunk of groups at a time.

    index: the index pass's `RolloutIndex` (groups, their tokens, the rows' files).
    chunks: each chunk's group positions (`chunk_groups`), in order.
    record: path, format and hash of the files (`rollouts_record`), for summary.json.
    temperature: τ for every row, when given (else each row's own).
    """

    index: RolloutIndex
    chunks: list[list[int]]
    record: dict[str, Any]
    temperature: float | None

    def read(self, shares: Sequence[Sequence[int]]) -> Iterator[Rollouts]:
        """One `Rollouts` per entry of `shares` (group positions: a part of each chunk, in
        order), τ overridden when asked; each file is opened once (`stream_chunks`)."""
        for rollouts in stream_chunks(self.index, shares):
            yield with_temperature(rollouts, self.temperature)


def load_rollout_stream(
    path: Path,
    temperature: float | None = None,
    *,
    steps: str | None = None,
    reward_columns: list[str] | None = None,
    chunk_tokens: int = CHUNK_TOKENS,
) -> RolloutStream:
    """The index of the rollouts `path` names (rows with a step in `steps`, "A-B";
    `reward_columns` as in `load_rollouts`), cut into chunks of about `chunk_tokens` response
    tokens, to be read a chunk at a time with `temperature` overriding every row's τ. Rows are
    validated when `RolloutStream.read` decodes them (`index_rollouts`' `validate=False`)."""
    index = index_rollouts(path, steps=steps, reward_columns=reward_columns, validate=False)
    chunks = chunk_groups(index.group_tokens, chunk_tokens)
    return RolloutStream(index, chunks, rollouts_record(index), temperature)


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


def load_rollouts(
    path: Path,
    temperature: float | None = None,
    *,
    steps: str | None = None,
    reward_columns: list[str] | None = None,
) -> Rollouts:
    """Read and validate rollouts (a file, a directory or a glob; rows with a step in `steps`,
    "A-B") through the streaming index, whole (`otb_diag/io/rollouts/stream.py:read_set`);
    `reward_columns` names a TRL completion log's reward columns; `temperature`, when given,
    overrides every row's τ."""
    return with_temperature(read_set(path, steps=steps, reward_columns=reward_columns), temperature)


def with_temperature(rollouts: Rollouts, temperature: float | None) -> Rollouts:
    """`rollouts` with every row's τ replaced by `temperature`, when given."""
    if temperature is None:
        return rollouts
    if temperature <= 0:
        raise InputError(f"temperature must be positive, got {temperature}", field="temperature")
    responses = [replace(r, temperature=temperature) for r in rollouts.responses]
    return replace(rollouts, responses=responses)


def group_rows(responses: list[Response]) -> dict[str, list[int]]:
    """Group id -> indices into `responses`, groups in order of first appearance."""
    out: dict[str, list[int]] = {}
    for i, r in enumerate(responses):
        out.setdefault(r.group, []).append(i)
    return out


def rollouts_record(rollouts: Rollouts | RolloutIndex) -> dict[str, Any]:
    """Path, format and hash of the rollouts (or of the set an index indexes); with several
    files, each file's hash."""
    files = rollouts.files or [Path(rollouts.path)]
    record: dict[str, Any] = {"path": str(Path(rollouts.path).resolve()), "format": rollouts.format}
    if len(files) == 1:
        return {**record, "sha256": file_sha256(files[0])}
    return {
        **record,
        "files": [{"path": str(f.resolve()), "sha256": file_sha256(f)} for f in files],
    }
