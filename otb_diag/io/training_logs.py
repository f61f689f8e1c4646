"""Training logs of RL runs read into one tidy table per run (docs/theory.md §5).

Three sources are recognised from the file's name and keys; what a trainer's log looks like is
declared in its module under `otb_diag/io/trainers/` (its signature and key map):

- `otb-diag`: our own `metrics.jsonl` (`otb-diag train`): flat keys `step, mean_reward,
  grad_norm, proxy2_total_power, proxy3_pure_noise, mean_response_length, tokens_sampled`, and
  optionally `baseline`, `group_size`. `tokens_sampled` is read as the running total.
- `verl` (`otb_diag/io/trainers/verl.py:VERL`): verl's metrics as JSONL, either flat dicts or
  its file logger's `{"step": n, "data": {...}}` rows, or as CSV (a W&B export, whose columns may
  carry a run-name prefix, `run-1 - actor/grad_norm`; the `__MIN`/`__MAX` band columns are
  dropped). Its per-step `perf/total_num_tokens` becomes `tokens_sampled` as a running sum over
  the logged rows: an export that skips steps undercounts.
- `trl` (`otb_diag/io/trainers/trl.py:TRL`): a Hugging Face / TRL `trainer_state.json`: the
  `log_history` entries of training steps, those that carry `loss` or `grad_norm` (evaluation
  entries and the final summary are skipped; under the knee controller only an update's last
  batch carries `grad_norm`), the score summed from the reward functions' keys when `reward`
  is absent, the variance proxy from `otb/proxy/grpo/proxy2_total_power` when
  `otb_diag.integrations.trl.attach` logged it.

Every run becomes a DataFrame with the columns of `COLUMNS`, NaN (or None) where the log has
no such key, then any `otb/...` metric the live diagnostics logged (docs/live.md; one renamed
since, the one-step noise scale, under today's name, `budget_stream.py:current_name`), sorted
by step; a step logged twice (a resumed run) keeps its last row.
`variance_proxy` holds verl's `proxy2_total_power` when the log has it and `proxy3_pure_noise`
otherwise; `variance_proxy_kind` says which. proxy2 comes first because it is forward-only:
proxy3 subtracts the squared gradient norm, so it moves with the very surge it should precede
(and verl logs it as 0.0 when the norm is unavailable). `proxy3_pure_noise` is kept beside it
whenever logged, so `dynamics` can say that it mixes units (`dynamics/units.py`).
`updates` counts the optimizer updates taken before each row's batch was generated: the knee
controller's logged `otb/controller/updates` carried forward over rows that lack it (0 before
its first) where it ran (several generation batches make one update there), else step − 1, not
below 0 (one update a step; TRL and verl count steps from 1). Under the controller,
`grad_norm` is kept only on rows whose update closed (the next row counts one more update, the
last row as logged): TRL logged, before the gate withheld it, at a batch that only adds to an
update the norm of the partial sum, which repeats over batches without a signal and is not what
the optimizer applied (read as a gradient norm, its flat stretches made the collapse rule fire
on a healthy SmolLM2 run).

`step`, `grad_norm` and the score are required; a missing one, a malformed line or a value that
is not a number is an `InputError` naming the file, the line or row, and the field, and
listing the keys found.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from otb_diag.errors import InputError, json_problem
from otb_diag.io.trainers import log_trainer
from otb_diag.io.trainers.trl import OTB_RECORD, REWARD_KEY, TRL, trainer_state
from otb_diag.maths.estimators.registry import families
from otb_diag.maths.noise.budget_stream import current_name

COLUMNS = (
    "step",
    "grad_norm",
    "score",
    "response_length",
    "variance_proxy",
    "variance_proxy_kind",
    "proxy3_pure_noise",
    "tokens_sampled",
    "updates",
    "baseline",
    "group_size",
)
REQUIRED = ("step", "grad_norm", "score")
# The live diagnostics' metrics (`otb_diag/integrations/`, docs/live.md) are kept as logged, one
# column each, after `COLUMNS`, whatever the source.
OTB_PREFIX = "otb/"
# The knee controller's metrics (`integrations/core/controller.py`, under `OTB_PREFIX`): the
# prompts of the optimizer update the step's batch belongs to, as the adapter applied it; the
# prompts the controller decided for the updates to come (an update opened later takes them);
# and the updates taken before the step's batch.
CONTROLLER_PROMPTS = "controller/prompts_per_update"
CONTROLLER_DECIDED = "controller/decided_prompts"
CONTROLLER_UPDATES = "controller/updates"
# Live metrics that both the dashboard's headline (`integrations/core/metric_levels.py:HEADLINE`)
# and `dynamics`' live figure (`plots/dynamics.py:LIVE_PANELS`) name, under `OTB_PREFIX`: OTB's
# variance proxy over the mean baseline's (verl's proxy2_total_power), the same without the
# part verl's zero tail adds, and the mean realized energy W(τ) of a response.
OTB_OVER_MEAN = "otb_over_mean/proxy2_total_power"
OTB_OVER_MEAN_WITHOUT_TAIL = "otb_over_mean/without_zero_tail/proxy2_total_power"
MEAN_ENERGY = "energy/sequence_mean"

# Canonical field -> keys accepted for it, in order of preference, in our own log (a trainer's
# are its `Trainer.log_keys`).
_OURS: dict[str, tuple[str, ...]] = {
    "step": ("step",),
    "grad_norm": ("grad_norm",),
    "score": ("mean_reward",),
    "response_length": ("mean_response_length",),
    "proxy2": ("proxy2_total_power",),
    "proxy3": ("proxy3_pure_noise",),
    "tokens_total": ("tokens_sampled",),
}
_OURS_SIGNATURE = ("mean_reward",)
# W&B CSV exports name columns "<run name> - <metric>" and add "__MIN"/"__MAX" band columns.
_WANDB_PREFIX = re.compile(r"^(?P<run>.+?) - (?P<key>.+)$")
_WANDB_BAND = ("__MIN", "__MAX")


@dataclass(frozen=True)
class TrainingLog:
    """One run's log: where it came from, which source it is, and its tidy table."""

    path: Path
    source: str  # "otb-diag", "verl" or "trl"
    frame: pd.DataFrame


def read_training_log(path: str | Path) -> TrainingLog:
    """Read a training log (our metrics.jsonl, verl JSONL/CSV or a trainer_state.json)."""
    path = Path(path)
    if not path.is_file():
        raise InputError("no such file", path=path)
    if path.suffix == ".csv":
        raw, where = _read_csv(path), "row"
    else:
        text = path.read_text(encoding="utf-8")
        try:
            state = trainer_state(text)
        except json.JSONDecodeError as err:  # one JSON document that breaks off (cut short?)
            raise InputError(
                f"not valid JSON ({json_problem(err)}); a trainer_state.json cut short breaks "
                "off here",
                path=path,
                line=err.lineno,
            ) from None
        if state is not None:
            return TrainingLog(path, TRL.name, _trl_frame(path, state))
        raw, where = _read_jsonl(path, text), "line"
    keys = set(raw.columns) - {"_line"}
    trainer = log_trainer(keys)
    if trainer is not None:
        return TrainingLog(path, trainer.name, _tidy(path, raw, trainer.log_keys, where))
    if any(k in keys for k in _OURS_SIGNATURE):
        return TrainingLog(path, "otb-diag", _tidy(path, raw, _OURS, where))
    raise InputError(
        "not a training log this tool knows: expected our metrics.jsonl (mean_reward, "
        "grad_norm, ...), verl metrics (actor/grad_norm, critic/score/mean, ...) or a "
        f"trainer_state.json with log_history. Keys found: {_listing(keys)}",
        path=path,
    )


def _listing(keys: set[str] | list[str]) -> str:
    return ", ".join(sorted(keys)) if keys else "(none)"


def _json_objects(path: Path, text: str) -> Iterator[tuple[int, dict[str, Any]]]:
    """(1-based line number, object) of every non-blank line; an `InputError` naming the line
    where one is not a JSON object."""
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as err:
            raise InputError(
                f"not valid JSON ({json_problem(err)})", path=path, line=number
            ) from None
        if not isinstance(row, dict):
            raise InputError("expected a JSON object per line", path=path, line=number)
        yield number, row


def _read_jsonl(path: Path, text: str) -> pd.DataFrame:
    """One row per non-blank line; verl's `{"step", "data": {...}}` rows are flattened. The
    1-based line number is kept in `_line` for error messages."""
    rows = []
    for number, row in _json_objects(path, text):
        if isinstance(row.get("data"), dict):
            row = {**{k: v for k, v in row.items() if k != "data"}, **row["data"]}
        rows.append({**row, "_line": number})
    if not rows:
        raise InputError("the file holds no rows", path=path)
    return pd.DataFrame(rows)


def otb_record(state_path: Path) -> dict[int, dict[str, Any]]:
    """The rows of `attach`'s full record (`OTB_RECORD`) beside the trainer_state.json at
    `state_path` (or in the folder above: a checkpoint's copy), by step; {} where there is
    none. A line without a whole-number `step` is an `InputError` naming it."""
    found = [f / OTB_RECORD for f in (state_path.parent, state_path.parent.parent)]
    record = next((f for f in found if f.is_file()), None)
    if record is None:
        return {}
    rows: dict[int, dict[str, Any]] = {}
    for number, row in _json_objects(record, record.read_text(encoding="utf-8")):
        step = row.get("step")
        if not isinstance(step, int) or isinstance(step, bool):
            raise InputError(
                "each line must be a JSON object with a whole-number step",
                path=record, line=number, field="step",
            )  # fmt: skip
        rows[step] = row  # a resumed run's later line for a step wins
    return rows


def _read_csv(path: Path) -> pd.DataFrame:
    """A CSV with run-name prefixes removed; more than one run in the file is refused."""
    try:
        raw = pd.read_csv(path)
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as err:
        raise InputError(f"not a readable CSV ({err})", path=path) from None
    raw = raw[[c for c in raw.columns if not str(c).endswith(_WANDB_BAND)]]
    runs, names = set(), {}
    for column in raw.columns:
        match = _WANDB_PREFIX.match(str(column))
        if match:
            runs.add(match["run"])
            names[column] = match["key"]
    if len(runs) > 1:
        raise InputError(
            f"the CSV holds several runs ({_listing(runs)}); export one run per file",
            path=path,
        )
    raw = raw.rename(columns=names)
    # Data row k (0-based) is text line k + 2 after the header.
    return raw.assign(_line=np.arange(len(raw)) + 2)


def _pick(raw: pd.DataFrame, candidates: tuple[str, ...]) -> str | None:
    return next((key for key in candidates if key in raw.columns), None)


def _numbers(path: Path, raw: pd.DataFrame, key: str, where: str) -> np.ndarray:
    """Column `key` as floats; a value present but not a number is an error at its line/row."""
    values = pd.to_numeric(raw[key], errors="coerce")
    bad = values.isna() & raw[key].notna()
    if bad.any():
        index = int(np.argmax(bad.to_numpy()))
        at = int(raw["_line"].iloc[index])
        location = {"line": at} if where == "line" else {"row": at}
        raise InputError(
            f"not a number: {raw[key].iloc[index]!r}", path=path, field=key, **location
        )
    return values.to_numpy(dtype=float)


def _constant(raw: pd.DataFrame, key: str) -> Any:
    """The first logged value of a per-run setting (baseline, group size), or None."""
    if key not in raw.columns:
        return None
    present = raw[key].dropna()
    return present.iloc[0] if len(present) else None


def _tidy(
    path: Path, raw: pd.DataFrame, keys: dict[str, tuple[str, ...]], where: str
) -> pd.DataFrame:
    """Map a raw table onto `COLUMNS` with the key table of its source."""
    found = {field: _pick(raw, candidates) for field, candidates in keys.items()}
    for field in REQUIRED:
        if found[field] is None:
            raise InputError(
                f"no {field} (looked for {', '.join(keys[field])}). "
                f"Keys found: {_listing(set(raw.columns) - {'_line'})}",
                path=path,
                field=keys[field][0],
            )
    column = {f: _numbers(path, raw, k, where) for f, k in found.items() if k is not None}
    nan = np.full(len(raw), np.nan)
    frame = pd.DataFrame(
        {
            "step": column["step"],
            "grad_norm": column["grad_norm"],
            "score": column["score"],
            "response_length": column.get("response_length", nan),
            "tokens_sampled": _tokens(path, raw, column, found),
        }
    )
    frame["variance_proxy"], frame["variance_proxy_kind"] = _variance_proxy(column, nan)
    frame["proxy3_pure_noise"] = column.get("proxy3", nan)  # kept to say its units mix
    frame["baseline"] = _constant(raw, "baseline")
    group_size = _constant(raw, "group_size")
    frame["group_size"] = float(group_size) if group_size is not None else np.nan
    live = {
        current_name(key, OTB_PREFIX): pd.to_numeric(raw[key], errors="coerce").to_numpy(float)
        for key in raw.columns
        if str(key).startswith(OTB_PREFIX)
    }  # added at once: a live log has hundreds (one by one fragments the frame)
    frame = pd.concat([frame, pd.DataFrame(live, index=frame.index)], axis=1)
    frame["_line"] = raw["_line"].to_numpy()
    return _finish(path, frame, found["step"], where)


def _variance_proxy(column: dict[str, np.ndarray], nan: np.ndarray) -> tuple[np.ndarray, str]:
    """proxy2 when logged (forward-only), else proxy3, else none (see the module docstring)."""
    for kind in ("proxy2", "proxy3"):
        if kind in column and np.isfinite(column[kind]).any():
            return column[kind], kind
    return nan, "none"


def _tokens(
    path: Path, raw: pd.DataFrame, column: dict[str, np.ndarray], found: dict[str, str | None]
) -> np.ndarray:
    """Running total of sampled tokens: a logged total as is, per-step counts summed."""
    if "tokens_per_step" in column:
        per_step = column["tokens_per_step"]
        total = np.cumsum(np.nan_to_num(per_step))
        return np.where(np.isfinite(per_step), total, np.nan)
    if "tokens_total" not in column:
        return np.full(len(raw), np.nan)
    total = column["tokens_total"]
    # Check the rows that will be kept (the last of each step, in step order): a resumed run
    # logs some steps twice, and its first, abandoned pass may have counted further.
    steps = pd.Series(column["step"])
    kept = np.flatnonzero(~steps.duplicated(keep="last").to_numpy())
    kept = kept[np.argsort(column["step"][kept], kind="stable")]
    logged = kept[np.isfinite(total[kept])]
    drops = np.flatnonzero(np.diff(total[logged]) < 0)
    if len(drops):
        at = logged[drops[0] + 1]
        raise InputError(
            "the running total of sampled tokens decreases here; it must be cumulative",
            path=path,
            line=int(raw["_line"].iloc[at]),
            field=found["tokens_total"],
        )
    return total


def _finish(path: Path, frame: pd.DataFrame, step_key: str | None, where: str) -> pd.DataFrame:
    """Rows without a step are an error; sort by step, keep the last row of a repeated step."""
    if frame.empty:
        raise InputError("the file holds no rows", path=path)
    missing = frame["step"].isna()
    if missing.any():
        at = int(frame["_line"][missing].iloc[0])
        location = {"line": at} if where == "line" else {"row": at}
        raise InputError("row without a step", path=path, field=step_key, **location)
    frame = frame.drop_duplicates("step", keep="last").sort_values("step", kind="stable")
    frame["step"] = frame["step"].astype(np.int64)
    frame["updates"] = _updates(frame)
    frame["grad_norm"] = _applied_norms(frame)
    live = sorted(c for c in frame.columns if str(c).startswith(OTB_PREFIX))
    return frame[[*COLUMNS, *live]].reset_index(drop=True)


def _controlled(frame: pd.DataFrame) -> bool:
    """The knee controller ran: the log counts its updates."""
    logged = OTB_PREFIX + CONTROLLER_UPDATES
    return logged in frame and bool(frame[logged].notna().any())


def _updates(frame: pd.DataFrame) -> np.ndarray:
    """[rows, in step order] the optimizer updates before each row's batch (module docstring)."""
    if _controlled(frame):
        return frame[OTB_PREFIX + CONTROLLER_UPDATES].ffill().fillna(0.0).to_numpy(dtype=float)
    return np.maximum(frame["step"].to_numpy(dtype=float) - 1, 0.0)


def _applied_norms(frame: pd.DataFrame) -> np.ndarray:
    """[rows] `grad_norm` where the optimizer applied it: every row, or under the controller
    the rows whose update closed (module docstring)."""
    norms = frame["grad_norm"].to_numpy(dtype=float)
    if not _controlled(frame):
        return norms
    closed = np.append(np.diff(frame["updates"].to_numpy()) > 0, True)
    return np.where(closed, norms, np.nan)


def _trl_frame(path: Path, state: dict[str, Any]) -> pd.DataFrame:
    """The training entries of a trainer_state.json as a tidy table."""
    history = state["log_history"]
    if not isinstance(history, list) or not all(isinstance(e, dict) for e in history):
        raise InputError("log_history must be a list of objects", path=path, field="log_history")
    # `_line` carries the entry's index in log_history; errors report it as a row. The `otb/`
    # metrics `attach` kept out of the trainer's log (its default level) come from its full
    # record beside it, the record's value winning (the log averages over `logging_steps`).
    record = otb_record(path)
    entries = [
        {**e, **record.get(e.get("step"), {}), "_line": k}
        for k, e in enumerate(history)
        if "loss" in e or "grad_norm" in e  # a training step's (module docstring)
    ]
    keys = {k for e in history for k in e}
    if not entries:
        raise InputError(
            f"no log_history entry of a training step (with loss or grad_norm). "
            f"Keys found: {_listing(keys)}",
            path=path,
            field="grad_norm",
        )
    raw = pd.DataFrame(entries)
    if "reward" not in raw.columns:
        parts = [c for c in raw.columns if REWARD_KEY.match(str(c))]
        if parts:
            raw["reward"] = (
                raw[parts].apply(pd.to_numeric, errors="coerce").sum(axis=1, min_count=len(parts))
            )
    return _tidy(path, raw, TRL.log_keys, "row")


_LABEL_GROUP_SIZE = re.compile(r"(?:^|[^a-z0-9])n\s*=?\s*(\d+)(?![0-9])", re.IGNORECASE)


def parse_label(label: str) -> tuple[str | None, int | None]:
    """Baseline and group size named in a run label such as `otb N=4`, `grpo-n8` or `rloo`.

    The baseline is the first word (split on anything but letters, digits) that is a baseline
    family, variants included (`otb-loo` gives `otb`); the group size follows an `N`, with or
    without `=`. Either is None when the label does not name it."""
    words = re.split(r"[^a-z0-9]+", label.lower())
    known = families()  # the registry's baseline families
    baseline = next((w for w in words if w in known), None)
    match = _LABEL_GROUP_SIZE.search(label)
    return baseline, int(match[1]) if match else None


def with_label(frame: pd.DataFrame, label: str) -> pd.DataFrame:
    """`frame` with baseline and group size taken from `label` where the log has none (a log's
    own value is what the run used, so it wins)."""
    baseline, group_size = parse_label(label)
    frame = frame.copy()
    if baseline is not None and frame["baseline"].isna().all():
        frame["baseline"] = baseline
    if group_size is not None and frame["group_size"].isna().all():
        frame["group_size"] = float(group_size)
    return frame
