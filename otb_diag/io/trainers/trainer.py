"""What one RL trainer writes, as data: how its rollout dumps and its training logs are recognised
and which of its keys hold each canonical field. One `Trainer` per trainer module (`verl.py`,
`trl.py`); `otb_diag/io/trainers/__init__.py` recognises a file's trainer from its keys."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from otb_diag.errors import InputError

Keys = dict[str, tuple[str, ...]]  # canonical field -> the trainer's keys, in order of preference
# (field, message, hint) -> the error for the record being mapped.
Fail = Callable[[str, str, str | None], InputError]
# (record, the --reward-column names or None, fail) -> the record in the dump keys' terms.
Prepare = Callable[[dict[str, Any], Sequence[str] | None, Fail], dict[str, Any]]


@dataclass(frozen=True)
class Trainer:
    """One trainer's files. A rollout dump is recognised from its first row's keys (Parquet: its
    columns): all of `dump_signature`, none of `dump_excludes`; a metrics log from any one of
    `log_signature` (a trainer whose log is recognised otherwise has none)."""

    name: str  # "verl", "trl": the prefix of `Rollouts.format`, and `TrainingLog.source`
    dump_signature: tuple[str, ...]
    dump_excludes: tuple[str, ...]
    dump_keys: Keys  # the row fields of `otb_diag/io/rollouts/rows.py:KEYS`, under its names
    prepare: Prepare | None  # maps each dump record before it is validated, when needed
    dump_dir: str | None  # where its output directory keeps the dumps, when in a sub-directory
    log_signature: tuple[str, ...]
    log_keys: Keys  # the fields of `otb_diag/io/training_logs.py:COLUMNS`, under its names
    # A fresh `Prepare` for each file, for a mapping that depends on the file's earlier rows
    # (verl's two uid forms, which one file must not mix); used instead of `prepare`.
    prepare_file: Callable[[], Prepare] | None = None
