"""The split a trainer logged at its split steps (`otb/split/...`, docs/live.md), pooled over the
run as the trainer's own `attach` pools it (`maths/noise/budget_stream.py`): the same object
fed the same numbers in the same order, so `otb-diag dynamics` on the log gives the live log's
`otb/budget/...` again (to the rounding of the log's file format: exact for JSON)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from otb_diag.errors import InputError
from otb_diag.maths.noise.budget_stream import BUDGET, SPLIT, BudgetPools, split_names
from otb_diag.maths.noise.split_checks import refused, unpooled
from otb_diag.pipelines.inputs import Say, silent

# The names the live diagnostics log a split under beside the trainer's own estimator: OTB
# (`integrations/core/step_metrics.py:split_baselines`) and all parameters
# (`integrations/trl/ddp_noise.py`).
BESIDE_THE_TRAINERS = ("otb", "params")


def pooled_over_steps(
    frame: pd.DataFrame, prefix: str, path: Path, say: Say = silent
) -> tuple[pd.DataFrame, BudgetPools]:
    """One row per step whose split pooled (`step` and every `<prefix>budget/...` column) and
    the pools after the last; `frame`: a tidy table of `io/training_logs.py` read from `path`,
    in step order, its live metrics under `prefix`. Empty when the log has no split.

    A value no run can log (`maths/noise/split_checks.py:refused`: a negative tr Σ, P < 1,
    N < 2, an infinite estimate, …) is an InputError naming the file, the step and the key; a
    split that cannot be pooled is said through `say`, once per reason, with its first step and
    how many steps share it."""
    pools = BudgetPools(prefix)
    columns = [c for c in frame.columns if str(c).startswith(prefix + SPLIT)]
    rows, skipped = [], {}  # reason -> the steps it skipped
    if columns:
        for step, values in zip(frame["step"], frame[columns].to_dict("records"), strict=True):
            bad = refused(values, prefix)
            if bad is not None:
                raise InputError(
                    f"at step {int(step)}, {bad.value:g} is impossible: {bad.rule}. No run "
                    "logs it, so the log was damaged or edited; its split is not pooled.",
                    path=path,
                    field=bad.key,
                )
            for reason in unpooled(values, prefix):
                skipped.setdefault(reason, []).append(int(step))
            found = pools.update(values, int(step))
            if found:
                rows.append({"step": int(step), **found})
    for reason, steps in skipped.items():
        more = f" and {len(steps) - 1} more" if len(steps) > 1 else ""
        say(f"{path}: not pooled at step {steps[0]}{more}: {reason}.")
    return pd.DataFrame(rows, columns=["step"] if not rows else None), pools


def budget_long(table: pd.DataFrame, prefix: str, run: str) -> pd.DataFrame:
    """`pooled_over_steps`' table in long form, one row per (step, estimator, pool) with a
    column per `pooling.Pooled` field: what the figure draws. A key is
    `<prefix>budget/<estimator>/<pool>/<field>`, read from its end: the pool and the field hold
    no "/", the estimator's name may."""
    head = prefix + BUDGET
    records = []
    for row in table.to_dict("records"):
        found: dict[tuple[str, str], dict[str, float]] = {}
        for key, value in row.items():
            if str(key).startswith(head):
                estimator, pool, field = str(key)[len(head) :].rsplit("/", 2)
                found.setdefault((estimator, pool), {})[field] = value
        records += [
            {"run": run, "step": row["step"], "estimator": e, "pool": p, **values}
            for (e, p), values in found.items()
        ]
    return pd.DataFrame(records)


def split_identity(frame: pd.DataFrame, prefix: str) -> tuple[str | None, int | None]:
    """The baseline and group size the split of `frame` (a tidy table of `io/training_logs.py`)
    is logged under, for a log that records neither: N when every logged `split/group_size` is
    the same whole number; the trainer's own estimator when the split names exactly one beside
    `BESIDE_THE_TRAINERS` (a split under OTB alone says nothing of what trained)."""
    split = prefix + SPLIT
    key = split + "group_size"
    sizes = frame[key].dropna().unique() if key in frame else []
    whole = len(sizes) == 1 and float(sizes[0]).is_integer()
    own = [n for n in split_names(frame.columns, split) if n not in BESIDE_THE_TRAINERS]
    return (own[0] if len(own) == 1 else None), (int(sizes[0]) if whole else None)
