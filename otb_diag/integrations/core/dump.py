"""A training step's batch written as rollouts with exact ids, one JSONL file per step.

`dump_dir/step_{step:06d}.jsonl` holds one row per response in the project's rollout format
(README "Rollout format"): `group`, `step`, `prompt_ids`, `response_ids`, `reward` (or
`token_rewards`), `trainer_advantage`, the policy's `logprobs` and `sum_pi2`, `is_weights`
(verl, off-policy), `temperature`, `mask` where some token was not generated, and
`advantage_estimator` (the registry baseline and options behind `trainer_advantage`). Each file is
written to a temporary name and renamed (`io/atomic.py`), so a reader of the directory, while
the run goes or after it crashed, sees whole steps only, and every otb-diag command reads the
directory as it is (`energy --model-free --rollouts dump_dir`, `variance-compare`,
`rollouts inspect`, `report`).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

from otb_diag.errors import InputError
from otb_diag.io.atomic import write_jsonl
from otb_diag.maths.response_batch import ResponseBatch
from otb_diag.maths.returns import outcome_token_rewards


def _step_file(dump_dir: Path, step: int) -> Path:
    """Where step `step`'s rows go (the step is the last number of the name, which is how
    `io/rollouts/sources.py:file_step` orders a directory's files)."""
    return dump_dir / f"step_{step:06d}.jsonl"


def check_dump_dir(dump_dir: str | Path) -> Path:
    """`dump_dir`, created if needed, after checking that a file can be written and renamed in
    it; an `InputError` naming it otherwise (raised before the training starts)."""
    path = Path(dump_dir)
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / f".otb-diag-probe-{os.getpid()}"
        probe.write_text("")
        probe.unlink()
    except OSError as e:
        raise InputError(
            f"the dump directory cannot be written: {e.strerror or e}.",
            path=path,
            hint="Give attach(..., dump_dir=) a writable directory, or leave dump_dir out.",
        ) from e
    return path


def batch_rows(batch: ResponseBatch) -> list[dict[str, Any]]:
    """One rollout row per response of `batch` (values as the float32 numbers they are, so
    `make_batch` reads back the same tensors)."""
    rows = []
    for i in range(len(batch.length)):
        n = int(batch.length[i])
        row: dict[str, Any] = {
            "group": batch.group_names[int(batch.group[i])],
            "step": batch.step[i],
            "prompt_ids": list(batch.prompt_ids[i]),
            "response_ids": batch.response_ids[i, :n].tolist(),
            "reward": float(batch.reward[i]),
            "logprobs": batch.logprobs[i, :n].tolist() if batch.logprobs is not None else None,
            "sum_pi2": batch.sum_pi2[i, :n].tolist() if batch.sum_pi2 is not None else None,
            "is_weights": batch.is_weights[i, :n].tolist()
            if batch.is_weights is not None
            else None,
            "temperature": float(batch.temperature[i]),
        }
        mask = batch.mask[i : i + 1, :n]  # [1, n]
        if bool((mask == 0).any()):
            row["mask"] = mask[0].to(int).tolist()
        rewards = batch.token_rewards[i : i + 1, :n]
        if not torch.equal(rewards, outcome_token_rewards(batch.reward[i : i + 1], mask)):
            row["token_rewards"] = rewards[0].tolist()  # not an outcome reward on the last token
        if batch.trainer_advantage is not None:
            a = batch.trainer_advantage[i, :n]
            same = n > 0 and bool((a == a[0]).all())  # TRL: one number per response
            row["trainer_advantage"] = float(a[0]) if same else a.tolist()
        rows.append({k: v for k, v in row.items() if v is not None})
    return rows


def dump_step(
    dump_dir: Path,
    batch: ResponseBatch,
    step: int,
    estimator: tuple[str, dict[str, Any]] | None = None,
) -> Path:
    """Write `batch` as step `step`'s file of `dump_dir`, atomically; return its path. With
    `estimator` (registry name, options: what produced `trainer_advantage`), every row records
    it as `advantage_estimator`, which `energy`'s audit then checks without being told."""
    rows = batch_rows(batch)
    if estimator is not None and batch.trainer_advantage is not None:
        record = {"baseline": estimator[0], "options": dict(estimator[1])}
        rows = [{**row, "advantage_estimator": record} for row in rows]
    dest = _step_file(dump_dir, step)
    write_jsonl(dest, rows)
    return dest
