"""From the user's paths to the rollouts a command measures: read and validate the set (the
streaming index's whole-set view), apply `--temperature`, and hand over in one object what
measuring it needs (the rows, their groups and sizes, their record for summary.json), so that a
recipe following `rollouts_path` goes down through io/ once (ARCHITECTURE.md, "Data flow"). The
checkpoint side (tokenize, check, batch) is `otb_diag/io/batches.py:checkpoint_batch`."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from otb_diag.errors import InputError
from otb_diag.io.load_options import LoadOptions as LoadOptions  # re-exported
from otb_diag.io.provenance import file_sha256
from otb_diag.io.rollouts.readers import Rollouts
from otb_diag.io.rollouts.rows import Response
from otb_diag.io.rollouts.scan import response_size
from otb_diag.io.rollouts.stream import read_set


@dataclass(frozen=True)
class RolloutSet:
    """What the load hands a recipe that measures the whole set.

    rollouts: every kept row, in set order (τ overridden when asked).
    groups: group name -> indices into `rollouts.responses`, in order of first appearance.
    sizes: `[rows]` each response's tokens (characters of its text when it has no ids yet).
    record: path, format and hash of the files (`rollouts_record`), for summary.json.
    """

    rollouts: Rollouts
    groups: dict[str, list[int]]
    sizes: list[int]
    record: dict[str, Any]


def load_rollout_set(
    path: Path,
    temperature: float | None = None,
    *,
    steps: str | None = None,
    reward_columns: list[str] | None = None,
) -> RolloutSet:
    """`load_rollouts` (same arguments), with the rows' groups, sizes and record."""
    rollouts = load_rollouts(path, temperature, steps=steps, reward_columns=reward_columns)
    return RolloutSet(
        rollouts=rollouts,
        groups=group_rows(rollouts.responses),
        sizes=[response_size(r) for r in rollouts.responses],
        record=rollouts_record(rollouts),
    )


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


def rollouts_record(rollouts: Rollouts) -> dict[str, Any]:
    """Path, format and hash of the rollouts; with several files, each file's hash."""
    files = rollouts.files or [Path(rollouts.path)]
    record: dict[str, Any] = {"path": str(Path(rollouts.path).resolve()), "format": rollouts.format}
    if len(files) == 1:
        return {**record, "sha256": file_sha256(files[0])}
    return {
        **record,
        "files": [{"path": str(f.resolve()), "sha256": file_sha256(f)} for f in files],
    }
