"""`otb-diag dynamics` end to end: read each training log, detect collapse and the variance
warning (`dynamics/collapse.py`), pool the split it logged over its steps
(`pipelines/pooled_budget.py`), write the tidy table, collapse.json, budget.csv (the pooled split
at every split step) and figures 1–2, score against tokens and the pooled noise scale
(`plots/dynamics.py`); with several runs, the comparison of their arms at equal tokens
(`dynamics/comparison.py`: runs sharing a --label are one arm's seeds), comparison.csv and its
figure."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import cast

import pandas as pd

from otb_diag.dynamics.collapse import RunDynamics, analyse_run
from otb_diag.dynamics.comparison import compare_arms
from otb_diag.dynamics.units import proxy_units
from otb_diag.errors import InputError
from otb_diag.io.atomic import write_with
from otb_diag.io.training_logs import (
    CONTROLLER_PROMPTS,
    OTB_PREFIX,
    read_training_log,
    with_label,
)
from otb_diag.maths.noise.budget_stream import BudgetPools
from otb_diag.pipelines.inputs import Say, silent
from otb_diag.pipelines.pooled_budget import budget_long, pooled_over_steps, split_identity
from otb_diag.pipelines.results.dynamics import (
    DynamicsArm,
    DynamicsResult,
    DynamicsRun,
    PooledBudget,
)
from otb_diag.pipelines.shell import Stage, run_recipe
from otb_diag.pipelines.training_logs.settings import DynamicsSettings, TrainingLogs
from otb_diag.plots.figure_data import DynamicsFigures
from otb_diag.plots.registry import save_figures

# A log's file name says little when every run writes the same one; its directory says more,
# unless it is a checkpoint folder (TRL writes trainer_state.json into checkpoint-<step>/).
_GENERIC_STEMS = {"metrics", "trainer_state", "history", "log", "logs"}
_CHECKPOINT_DIR = re.compile(r"^(checkpoint-\d+|global_step_?\d+|checkpoints?|logs?)$")


def _run_name(path: Path) -> str:
    """The run a log belongs to: its file stem, or for a generic name its run directory (the
    first folder above it that is not a checkpoint folder)."""
    if path.stem not in _GENERIC_STEMS:
        return path.stem
    folder = path.resolve().parent
    while _CHECKPOINT_DIR.match(folder.name) and folder.parent != folder:
        folder = folder.parent
    return folder.name or path.stem


def default_names(paths: list[Path]) -> list[str]:
    """Run names (`_run_name`), made unique with #2, #3, ..."""
    names: list[str] = []
    for path in paths:
        base = _run_name(path)
        name, k = base, 1
        while name in names:
            k += 1
            name = f"{base}#{k}"
        names.append(name)
    return names


def _seed_names(labels: list[str]) -> list[str]:
    """Run names for `labels`: a label one run has names it; the runs sharing a label (one arm's
    seeds) are `label#1`, `label#2`, … in order."""
    counts = {label: labels.count(label) for label in labels}
    seen: dict[str, int] = {}
    names = []
    for label in labels:
        seen[label] = seen.get(label, 0) + 1
        names.append(label if counts[label] == 1 else f"{label}#{seen[label]}")
    return names


def run_dynamics(
    inputs: TrainingLogs,
    out: Path,
    settings: DynamicsSettings = DynamicsSettings(),
    *,
    say: Say = silent,
) -> DynamicsResult | None:
    """Read every log of `inputs`, analyse it, write the table, the figures and collapse.json
    into `out` (all together, in the shell's staging folder); returns the result (collapse.json
    is its `to_json()`; None on a torchrun rank but 0). `inputs.labels`: one per log, the runs
    sharing one being one arm's seeds (`_seed_names`); none: `default_names`, one arm per run.
    `say`: the notes, such as a logged split that could not be pooled and why."""
    labels = inputs.labels or default_names(inputs.logs)
    if len(labels) != len(inputs.logs):
        raise InputError(
            f"{len(labels)} --label for {len(inputs.logs)} --log: give one label per log, or none",
            field="--label",
        )
    # Reading logs is one process's work: rank 0 alone, the others wait (under torchrun too).
    return run_recipe(
        lambda stage: _analyse(inputs.logs, labels, settings, out, stage),
        out=out,
        record="collapse.json",
        say=say,
        every_rank=False,
    )


def _analyse(
    logs: list[Path], labels: list[str], settings: DynamicsSettings, out: Path, stage: Stage
) -> DynamicsResult:
    """`run_dynamics` on the logs with their `labels`, writing into the folder `stage.into`
    (the staging folder of `out`, the result's `outputs`) and saying its notes by `stage.say`."""
    into = cast(Path, stage.into)
    rule, target, names = settings.rule, settings.target, _seed_names(labels)
    tables, runs, budgets = [], [], []
    for path, name, label in zip(logs, names, labels, strict=True):
        log = read_training_log(path)
        frame = with_label(log.frame, label)
        found = analyse_run(frame, rule, target)
        pooled, pools = pooled_over_steps(frame, OTB_PREFIX, path, stage.say)
        budgets.append(budget_long(pooled, OTB_PREFIX, name))
        runs.append(_row(name, path, log.source, frame, found, pools))
        tables.append(
            frame.assign(
                run=name,
                source=log.source,
                file=str(path),
                score_smoothed=found.score_smoothed,
                grad_norm_z=found.grad_norm_z,
                variance_z=found.variance_z,
                **_identity(frame, runs[-1]),
            )
        )
    table = pd.concat(tables, ignore_index=True)
    first = ["run", "source", "file", "step"]
    table = table[first + [c for c in table.columns if c not in first]]
    arms = [DynamicsArm(**row) for row in compare_arms(runs, labels)] if len(runs) > 1 else []
    result = DynamicsResult(
        rule=rule,
        target=target,
        runs=runs,
        outputs=str(out.resolve()),
        arms=arms,
    )
    write_with(into / "dynamics.csv", lambda p: table.to_csv(p, index=False))
    budget = pd.concat(budgets, ignore_index=True)
    if len(budget):  # a log held the split: the pooled noise scale over training
        write_with(into / "budget.csv", lambda p: budget.to_csv(p, index=False))
    if arms:  # several runs: the comparison at equal tokens, its table and figure
        comparison = _comparison_table(arms)
        write_with(into / "comparison.csv", lambda p: comparison.to_csv(p, index=False))
    data = DynamicsFigures(
        table,
        runs,
        target,
        live_runs=runs if result.live_runs else None,  # a trainer logged the live diagnostics
        budget=budget if len(budget) else None,
        arms=arms or None,
        arm_of=dict(zip(names, labels, strict=True)) if arms else None,
    )
    save_figures("dynamics", data, into)
    return result


def _comparison_table(arms: list[DynamicsArm]) -> pd.DataFrame:
    """comparison.csv: one row per arm, its per-run lists joined by "; " ("" for a run without
    a collapse or that never reached the target)."""
    rows = []
    for arm in arms:
        row = dataclasses.asdict(arm)
        for column in ("runs", "collapse_steps", "tokens_to_target", "updates_to_target"):
            row[column] = "; ".join("" if v is None else str(v) for v in row[column])
        rows.append(row)
    return pd.DataFrame(rows)


def _row(
    name: str, path: Path, source: str, frame: pd.DataFrame, found: RunDynamics, pools: BudgetPools
) -> DynamicsRun:
    """collapse.json's row of the log at `path`, read as `source` into `frame` (labelled), with
    the split it logged as `pools` pooled it. Baseline and N: the log's, else the label's, else
    those its split is logged under (`pooled_budget.split_identity`: a TRL log records
    neither)."""
    baseline = frame["baseline"].dropna()
    group_size = frame["group_size"].dropna()
    split_baseline, split_n = split_identity(frame, OTB_PREFIX)
    final = pd.Series(found.score_smoothed).dropna()
    otb, otb_steps = _live_metrics(frame) or (None, None)
    return DynamicsRun(
        run=name,
        file=str(path.resolve()),
        source=source,
        baseline=str(baseline.iloc[0]) if len(baseline) else split_baseline,
        group_size=int(group_size.iloc[0]) if len(group_size) else split_n,
        points=len(frame),
        first_step=int(frame["step"].iloc[0]),
        last_step=int(frame["step"].iloc[-1]),
        final_score_smoothed=float(final.iloc[-1]) if len(final) else None,
        **found.summary(),
        **proxy_units(frame),
        otb=otb,
        otb_steps=otb_steps,
        budget=_budget(pools, frame),
    )


def _identity(frame: pd.DataFrame, row: DynamicsRun) -> dict[str, pd.Series]:
    """The table's baseline and group size where the log and the label name neither, from the
    run's row (its split's, `_row`), so that the table and the figures say what the row says
    (a TRL log's score against tokens read "grpo, N=?" beside N = 4)."""
    return {
        column: frame[column].fillna(value) if value is not None else frame[column]
        for column, value in (("baseline", row.baseline), ("group_size", row.group_size))
    }


def _budget(pools: BudgetPools, frame: pd.DataFrame) -> list[PooledBudget] | None:
    """Each estimator's pooled split after the log's last split step, its sentence with the
    prompts an update took there where a knee controller ran; None without a split."""
    if pools.last_step is None:
        return None
    per_update = None
    key = OTB_PREFIX + CONTROLLER_PROMPTS
    if key in frame:
        logged = frame.loc[frame["step"] <= pools.last_step, key].dropna()
        per_update = float(logged.iloc[-1]) if len(logged) else None
    return [
        PooledBudget(
            estimator=name,
            step=pools.last_step,
            sentence=found["window"].sentence(name, pools.last_step, per_update),
            window=found["window"].metrics(),
            ema=found["ema"].metrics(),
        )
        for name, found in pools.latest.items()
    ]


def _live_metrics(frame: pd.DataFrame) -> tuple[dict[str, float | None], dict[str, int]] | None:
    """Each live diagnostics' metric (docs/live.md) the log has, with its value at one step, and
    that step: per family of metrics (the keys sharing all but their last "/" part, such as one
    estimator's pooled window `otb/budget/<b>/window/`), the last step that logged any of them,
    so that a noise scale and its interval's ends are the same step's (a value that step did not
    log, such as an infinite end TRL leaves out, is None). None when the log has none."""
    live = [c for c in frame.columns if c.startswith(OTB_PREFIX) and frame[c].notna().any()]
    if not live:
        return None
    families: dict[str, list[str]] = {}
    for column in live:
        families.setdefault(column.rsplit("/", 1)[0], []).append(column)
    values: dict[str, float | None] = {}
    steps: dict[str, int] = {}
    for columns in families.values():
        row = frame[columns][frame[columns].notna().any(axis=1)].iloc[-1]  # the last that logs
        step = int(frame["step"][row.name])
        values |= {c: None if pd.isna(row[c]) else float(row[c]) for c in columns}
        steps |= dict.fromkeys(columns, step)
    return values, steps
