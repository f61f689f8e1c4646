"""The RL trainers whose files are read as they are written, one module per trainer, each
declaring one `Trainer` (`trainer.py`): verl (`verl.py`: rollout dumps and metrics logs) and TRL
(`trl.py`: completion logs and `trainer_state.json`). A file that no trainer's signature matches
is in the project's own format (`otb_diag/io/rollouts/rows.py:KEYS`, our `metrics.jsonl`).

A new trainer is one module declaring its `Trainer` and one entry in `TRAINERS`."""

from __future__ import annotations

from collections.abc import Collection

from otb_diag.io.trainers.trainer import Trainer
from otb_diag.io.trainers.trl import TRL
from otb_diag.io.trainers.verl import VERL

TRAINERS: tuple[Trainer, ...] = (VERL, TRL)  # recognised in this order


def dump_trainer(keys: Collection[str]) -> Trainer | None:
    """The trainer whose rollout dump has these keys in its first row (Parquet: these columns),
    or None for the project's own format."""
    for trainer in TRAINERS:
        if all(k in keys for k in trainer.dump_signature) and not any(
            k in keys for k in trainer.dump_excludes
        ):
            return trainer
    return None


def log_trainer(keys: Collection[str]) -> Trainer | None:
    """The trainer whose metrics log has one of these keys, or None."""
    return next((t for t in TRAINERS if any(k in keys for k in t.log_signature)), None)
