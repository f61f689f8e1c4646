"""The split a trainer logged at its split steps (`otb/split/...`, docs/live.md), pooled over the
run as the trainer's own `attach` pools it (`maths/variance/budget_stream.py`): the same object
fed the same numbers in the same order, so `otb-diag dynamics` on the log gives the live log's
`otb/budget/...` again (to the rounding of the log's file format: exact for JSON)."""

from __future__ import annotations

import pandas as pd

from otb_diag.maths.variance.budget_stream import BUDGET, SPLIT, BudgetPools


def pooled_over_steps(frame: pd.DataFrame, prefix: str) -> tuple[pd.DataFrame, BudgetPools]:
    """One row per step whose split pooled (`step` and every `<prefix>budget/...` column) and
    the pools after the last; `frame`: a tidy table of `io/training_logs.py`, in step order,
    its live metrics under `prefix`. Empty when the log has no split."""
    pools = BudgetPools(prefix)
    columns = [c for c in frame.columns if str(c).startswith(prefix + SPLIT)]
    rows = []
    if columns:
        for step, values in zip(frame["step"], frame[columns].to_dict("records"), strict=True):
            found = pools.update(values, int(step))
            if found:
                rows.append({"step": int(step), **found})
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
