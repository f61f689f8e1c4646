"""The numbers of an `otb-diag energy` or `otb-diag variance-compare` run directory as flat
metrics, `name -> Metric`, the material `regress` compares with a golden file.

Deterministic metrics (same inputs, same numbers): the summary's energy block, every variance
proxy per baseline, each baseline's advantage statistics over generated tokens, the sequence
energy mean/median and the proxy-fidelity correlations.

Statistical metrics (from `variance.csv`; they move when `--seed` moves) carry a 95 % interval
for `regress`'s overlap test. Overlap of two 95 % intervals is a conservative test: a reseeded run
fails it far less often than 5 % of the time, while a shift of more than both half-widths fails.
- `variance`: the bootstrap interval `ci_low`/`ci_high` of variance.csv, widened for the seeded
  random projection of the scores, which the bootstrap (over draws, projection fixed) does not
  see: the variance of projected estimates is `tr(P Σ Pᵀ)`, and a Gaussian projection to k
  dimensions scales `tr Σ` by a factor whose relative variance is at most `2 / k` (Σ of rank
  one), where it is `χ²_k / k`; the `head` mode's Kronecker sketch is a product of two such
  factors (k₁ k₂ = k). With that factor's 95 % range `[q_lo, q_hi]`, the stored interval is
  `[ci_low / q_hi, ci_high / q_lo]`: an interval for the unprojected variance. Without it,
  reseeding the reduced default (k = 32) failed 12-24 of 84 variance rows.
- `ratio_to_mean`, `equivalent_mean_group_size`, `token_savings`: recomputed by the library's
  own `compare_to_mean` at the four corners (this baseline's widened interval's low or high
  end) x (the `mean` curve at its widened intervals' low or high ends); the interval is the
  range of the corners and the point value (`pipelines/variance/evidence.py`, the same intervals
  variance-compare's verdicts read). The projection is shared by all baselines of a run
  but does not cancel in ratios (reseeding moved proxy-mode `none`/`mean` from 0.26 to 0.60 on
  the reduced default), and the corners ignore the pairing of the draws, so these bands are wide
  on purpose: the variances and `bias_z` are where a regression is caught.
- `bias_z`: a root-mean-square z-score, read as one z-score with unit standard error,
  `[max(0, z - 1.96), z + 1.96]`, then widened like the variance by the projection (z scales
  like the square root of a projected squared norm): `[lo / √q_hi, hi / √q_lo]`. A sign flip in
  a baseline's advantages turns `ĝ_b - ĝ_none` into `-(ĝ_b + ĝ_none)` and moves `bias_z` by
  many units.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import pandas as pd

from otb_diag.errors import InputError
from otb_diag.maths.variance.intervals import DERIVED, projection_factor_range
from otb_diag.pipelines.results.energy import EnergyResult
from otb_diag.pipelines.results.read import Result, read_record, result_from_json
from otb_diag.pipelines.results.variance import VarianceResult
from otb_diag.pipelines.variance.evidence import mode_intervals, projection_dims

RUN_COMMANDS = ("energy", "variance-compare")

Kind = Literal["deterministic", "statistical"]

Z_95 = 1.959963984540054  # two-sided 95 % normal quantile
# Columns of variance.csv that regress reads; the derived ones get intervals by propagation.
VARIANCE_COLUMNS = (
    *("mode", "aggregation", "baseline", "group_size"),
    *("variance", "ci_low", "ci_high", "bias_z", *DERIVED),
)


@dataclass(frozen=True)
class Metric:
    """One number; statistical metrics carry their 95 % interval `ci`."""

    kind: Kind
    value: float
    ci: tuple[float, float] | None = None

    def interval(self) -> tuple[float, float]:
        return self.ci if self.ci is not None else (self.value, self.value)

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {"kind": self.kind, "value": _encode(self.value)}
        if self.ci is not None:
            data["ci"] = [_encode(x) for x in self.ci]
        return data

    def __str__(self) -> str:
        text = f"{self.value:.8g}"
        return text if self.ci is None else f"{text} [{self.ci[0]:.4g}, {self.ci[1]:.4g}]"


def _encode(x: float) -> float | str:
    """Strict JSON has no inf/nan; write them as the strings "inf", "-inf", "nan" so they stay
    distinguishable (a plain null could be any of them)."""
    return x if math.isfinite(x) else str(x)


def collect_metrics(path: Path) -> dict[str, Metric]:
    """Every metric of every energy/variance-compare run at or under `path`, each name prefixed
    with the run's directory relative to `path` (`energy/proxies/otb/proxy2_total_power`)."""
    if not path.exists():
        raise InputError("no such file or directory", path=path, field="--current")
    metrics: dict[str, Metric] = {}
    for run_dir, _, result in find_runs(path):
        rel = run_dir.relative_to(path).as_posix()
        prefix = "" if rel == "." else rel + "/"
        found = (
            _energy_metrics(run_dir, result)
            if isinstance(result, EnergyResult)
            else variance_metrics(run_dir, result)
        )
        metrics.update({prefix + name: metric for name, metric in found.items()})
    return metrics


# The file each command writes its record into (collapse.json of dynamics runs made before
# it held a "command" is recognised by its "runs", and refused for its schema version).
RECORD_FILES = {
    "energy": "summary.json",
    "variance-compare": "summary.json",
    "train": "train.json",
    "dynamics": "collapse.json",
}


def find_runs(
    path: Path,
    commands: Sequence[str] = RUN_COMMANDS,
    field: str = "--current",
    *,
    required: bool = True,
) -> list[tuple[Path, str, Result]]:
    """(directory, command, result) of every run at or under `path` written by one of
    `commands`: its record file of `RECORD_FILES` read back into its result class
    (`pipelines/results/read.py`, which refuses another schema version). Other JSON files of
    the same names are skipped; none at all is an input error naming `field` when `required`."""
    names = sorted({RECORD_FILES[c] for c in commands})
    files = sorted(f for name in names for f in path.rglob(name)) if path.is_dir() else []
    runs = []
    for record_path in files:
        record = read_record(record_path)
        if not isinstance(record, dict):
            continue
        if record_path.name == RECORD_FILES["dynamics"] and "runs" in record:
            record = {**record, "command": "dynamics"}
        command = record.get("command")
        if command not in commands:
            continue
        runs.append((record_path.parent, command, result_from_json(record, record_path)))
    if not runs and required:
        written_by = " or ".join(f"`otb-diag {c}`" for c in commands)
        raise InputError(
            f"no run outputs here: expected a directory written by {written_by} "
            f"({', '.join(names)}, ...) or a directory holding several",
            path=path,
            field=field,
        )
    return runs


def _read(path: Path, reader: Callable[[Path], Any]) -> Any:
    """`reader(path)`, with a missing or unreadable output file turned into an input error."""
    try:
        return reader(path)
    except (OSError, ValueError, KeyError) as err:
        raise InputError(f"cannot read this run output: {err}", path=path) from None


def _require(frame: pd.DataFrame, columns: Sequence[str], path: Path) -> pd.DataFrame:
    missing = [c for c in columns if c not in frame]
    if missing:
        raise InputError(f"missing column(s) {', '.join(missing)}", path=path)
    return frame


def _steps(frame: pd.DataFrame) -> Iterator[tuple[str, pd.DataFrame]]:
    """(name prefix, rows) per checkpoint step: a `<step>/` level only when the run measured
    several checkpoints, as proxies.json nests per step only then."""
    if "step" in frame and frame["step"].nunique() > 1:
        for step, rows in frame.groupby("step", sort=True):
            yield f"{step}/", rows
    else:
        yield "", frame


def _flatten(data: Any, prefix: str = "") -> Iterator[tuple[str, float]]:
    """`prefix/key/.../leaf` for every number in nested dicts (bools and strings skipped)."""
    if isinstance(data, dict):
        for key, value in data.items():
            yield from _flatten(value, f"{prefix}{key}/")
    elif isinstance(data, (int, float)) and not isinstance(data, bool):
        yield prefix.rstrip("/"), float(data)


def _energy_metrics(run_dir: Path, result: EnergyResult) -> dict[str, Metric]:
    """Deterministic metrics of an `otb-diag energy` run."""
    values = dict(_flatten(asdict(result.energy), "summary/"))
    values.update(_flatten(_read(run_dir / "proxies.json", _read_json), "proxies/"))

    path = run_dir / "tokens.parquet"
    tokens = _require(_read(path, _read_advantages), ["mask"], path)
    adv_columns = [c for c in tokens.columns if c.startswith("adv_")]
    for step, rows in _steps(tokens):
        generated = rows[rows["mask"] == 1]
        for column in adv_columns:
            a = generated[column].to_numpy(np.float64)
            name = f"advantages/{step}{column.removeprefix('adv_')}"
            values[f"{name}/mean"] = float(a.mean())
            values[f"{name}/std"] = float(a.std())  # population std (ddof 0)
            values[f"{name}/min"] = float(a.min())
            values[f"{name}/max"] = float(a.max())
            values[f"{name}/mean_abs"] = float(np.abs(a).mean())

    path = run_dir / "sequences.csv"
    sequences = _require(_read(path, pd.read_csv), ["energy"], path)
    for step, rows in _steps(sequences):
        energy = rows["energy"].to_numpy(np.float64)
        values[f"sequences/{step}energy_mean"] = float(energy.mean())
        values[f"sequences/{step}energy_median"] = float(np.median(energy))
    return {name: Metric("deterministic", v) for name, v in values.items()}


def _read_json(path: Path) -> Any:
    return json.loads(path.read_text(encoding="utf-8"))


def _read_advantages(path: Path) -> pd.DataFrame:
    """Only the columns the advantage statistics need: tokens.parquet of a real run is big."""
    import pyarrow.parquet as pq

    names = pq.read_schema(path).names
    wanted = [c for c in names if c in ("step", "mask") or c.startswith("adv_")]
    return pd.read_parquet(path, columns=wanted)


def read_fidelity(path: Path) -> pd.DataFrame:
    """fidelity.csv; a proxy-only run writes it without rows (or even a header)."""
    try:
        return pd.read_csv(path)
    except pd.errors.EmptyDataError:
        return pd.DataFrame()


def variance_metrics(run_dir: Path, result: VarianceResult) -> dict[str, Metric]:
    """Statistical metrics of variance.csv (with intervals) and deterministic fidelity ones; a
    run whose rewards carried no signal wrote no table: its signal counts alone."""
    if not result.signal.carries_any:
        return {
            f"signal/{name}": Metric("deterministic", float(value))
            for name, value in (("groups", result.signal.groups),
                                ("groups_with_signal", result.signal.groups_with_signal))
        }  # fmt: skip
    path = run_dir / "variance.csv"
    table = _require(_read(path, pd.read_csv), VARIANCE_COLUMNS, path)
    k = result.sketch_dim
    metrics: dict[str, Metric] = {}
    for step, per_step in _steps(table):
        for mode, rows in per_step.groupby("mode", sort=False):
            # Intervals for the unprojected variance, from which everything else is derived
            # (the ones variance-compare's verdicts read: pipelines/variance/evidence.py).
            rows = mode_intervals(rows, str(mode), k)
            q_lo, q_hi = projection_factor_range(projection_dims(str(mode), k))
            for _, row in rows.iterrows():
                name = f"{step}{mode}/{row['aggregation']}/{row['baseline']}/N{row['group_size']}/"
                metrics[name + "variance"] = Metric(
                    "statistical",
                    float(row["variance"]),
                    (float(row["ci_low"]), float(row["ci_high"])),
                )
                for column in DERIVED:
                    metrics[name + column] = Metric(
                        "statistical",
                        float(row[column]),
                        (float(row[f"{column}_low"]), float(row[f"{column}_high"])),
                    )
                z = float(row["bias_z"])
                metrics[name + "bias_z"] = Metric(
                    "statistical",
                    z,
                    (max(0.0, z - Z_95) / math.sqrt(q_hi), (z + Z_95) / math.sqrt(q_lo)),
                )

    fidelity = _read(run_dir / "fidelity.csv", read_fidelity)
    for step, rows in _steps(fidelity):
        for row in rows.to_dict("records"):
            # The whole parameter vector (block "all", or no block column in older runs) keeps
            # the plain name; a parameter block adds its name: fidelity/full/layer.0/...
            block = row.get("block", "all")
            where = f"{row['mode']}" if block == "all" else f"{row['mode']}/{block}"
            for column, value in row.items():
                if column not in ("step", "mode", "block"):
                    metrics[f"fidelity/{step}{where}/{column}"] = Metric(
                        "deterministic", float(value)
                    )
    return metrics
