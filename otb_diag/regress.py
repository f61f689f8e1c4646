"""Regression checks on the numbers `otb-diag energy` and `otb-diag variance-compare` write, so
CI fails when a change to a trainer, tokenizer or sampler moves the variance picture.

A run directory is turned into flat metrics, `name -> Metric`, and compared with a golden file.

Deterministic metrics (same inputs, same numbers): the summary's energy block, every variance
proxy per baseline, each baseline's advantage statistics over generated tokens, the sequence
energy mean/median and the proxy-fidelity correlations. They pass when
`|current - golden| <= max(abs, rel * max(|current|, |golden|))` (`math.isclose`'s rule) with
the defaults `DEFAULT_TOLERANCE` or the override file's last matching pattern.

Statistical metrics (from `variance.csv`; they move when `--seed` moves) carry a 95 % interval
and pass when the golden and current intervals overlap (within the same tolerance, which is
negligible by default). Overlap of two 95 % intervals is a conservative test: a reseeded run
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
  range of the corners and the point value. The projection is shared by all baselines of a run
  but does not cancel in ratios (reseeding moved proxy-mode `none`/`mean` from 0.26 to 0.60 on
  the reduced default), and the corners ignore the pairing of the draws, so these bands are wide
  on purpose: the variances and `bias_z` are where a regression is caught.
- `bias_z`: a root-mean-square z-score, read as one z-score with unit standard error,
  `[max(0, z - 1.96), z + 1.96]`, then widened like the variance by the projection (z scales
  like the square root of a projected squared norm): `[lo / √q_hi, hi / √q_lo]`. A sign flip in
  a baseline's advantages turns `ĝ_b - ĝ_none` into `-(ĝ_b + ĝ_none)` and moves `bias_z` by
  many units.
Non-finite values (`inf` = beyond the measured range, `nan`) pass only against the same value.
"""

from __future__ import annotations

import fnmatch
import functools
import json
import math
import xml.etree.ElementTree as ET
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from itertools import product
from pathlib import Path
from typing import Any, Literal

import numpy as np
import pandas as pd

from otb_diag.atomic import write_text
from otb_diag.errors import InputError

GOLDEN_FORMAT = "otb-diag-golden/1"
RUN_COMMANDS = ("energy", "variance-compare")

Kind = Literal["deterministic", "statistical"]
Status = Literal["pass", "fail", "missing", "extra"]

Z_95 = 1.959963984540054  # two-sided 95 % normal quantile
# Columns of variance.csv that regress reads; the derived ones get intervals by propagation.
DERIVED = ("ratio_to_mean", "equivalent_mean_group_size", "token_savings")
VARIANCE_COLUMNS = (
    *("mode", "aggregation", "baseline", "group_size"),
    *("variance", "ci_low", "ci_high", "bias_z", *DERIVED),
)


@dataclass(frozen=True)
class Tolerance:
    """Allowed difference: `max(abs, rel * max(|golden|, |current|))`."""

    rel: float
    abs: float

    def allowed(self, *values: float) -> float:
        # An infinite value must not make the relative allowance infinite: inf vs 5 fails.
        scale = max((abs(v) for v in values if math.isfinite(v)), default=0.0)
        return max(self.abs, self.rel * scale)

    def __str__(self) -> str:
        return f"rel {self.rel:g}, abs {self.abs:g}"


# float32 forward passes: two runs on one machine agree bit for bit (checked by the tests), but
# another CPU, BLAS or thread count reorders the float32 sums, which moves a value by a few
# 1e-7 relative per operation and up to ~1e-5 after sums over thousands of tokens. 1e-4 leaves
# that headroom while any real change (a flipped advantage, another tokenizer, a retrained
# model) moves these numbers by far more. `abs` covers values that are 0 up to rounding, such as
# the mean of a group-centred advantage, whose float32 rounding is ~1e-8.
DEFAULT_TOLERANCE = Tolerance(rel=1e-4, abs=1e-6)


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


@dataclass(frozen=True)
class Row:
    """The verdict on one metric. `golden`/`current` is None when the metric is missing/extra."""

    name: str
    status: Status
    golden: Metric | None
    current: Metric | None
    tolerance: Tolerance
    message: str = ""

    def tolerance_text(self) -> str:
        metric = self.golden or self.current
        if metric is not None and metric.kind == "statistical":
            return "95% intervals overlap"
        return str(self.tolerance)

    def to_json(self) -> dict[str, Any]:
        return {
            "metric": self.name,
            "status": self.status,
            "golden": self.golden.to_json() if self.golden else None,
            "current": self.current.to_json() if self.current else None,
            "tolerance": {"rel": self.tolerance.rel, "abs": self.tolerance.abs},
            "message": self.message,
        }


def _encode(x: float) -> float | str:
    """Strict JSON has no inf/nan; write them as the strings "inf", "-inf", "nan" so they stay
    distinguishable (a plain null could be any of them)."""
    return x if math.isfinite(x) else str(x)


def _number(x: Any, where: str, path: Path) -> float:
    """A golden value: a number, "inf"/"-inf"/"nan", or null (read as nan)."""
    if x is None:
        return math.nan
    if isinstance(x, (int, float)) and not isinstance(x, bool):
        return float(x)
    if isinstance(x, str) and x in ("inf", "-inf", "nan"):
        return float(x)
    raise InputError(f"{where}: expected a number, got {x!r}", path=path)


# ---------------------------------------------------------------------------------------------
# Collecting metrics from run directories
# ---------------------------------------------------------------------------------------------


def collect_metrics(path: Path) -> dict[str, Metric]:
    """Every metric of every energy/variance-compare run at or under `path`, each name prefixed
    with the run's directory relative to `path` (`energy/proxies/otb/proxy2_total_power`)."""
    if not path.exists():
        raise InputError("no such file or directory", path=path, field="--current")
    metrics: dict[str, Metric] = {}
    for run_dir, summary in find_runs(path):
        rel = run_dir.relative_to(path).as_posix()
        prefix = "" if rel == "." else rel + "/"
        found = (
            energy_metrics(run_dir, summary)
            if summary["command"] == "energy"
            else variance_metrics(run_dir, summary)
        )
        metrics.update({prefix + name: metric for name, metric in found.items()})
    return metrics


def find_runs(path: Path) -> list[tuple[Path, dict[str, Any]]]:
    """(directory, summary) of every `summary.json` at or under `path` written by a command
    that `regress` knows; other summaries are skipped. None at all is an input error."""
    runs = []
    for summary_path in sorted(path.rglob("summary.json")) if path.is_dir() else []:
        try:
            summary = json.loads(summary_path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
            raise InputError(f"cannot read the run summary: {err}", path=summary_path) from None
        if isinstance(summary, dict) and summary.get("command") in RUN_COMMANDS:
            runs.append((summary_path.parent, summary))
    if not runs:
        raise InputError(
            "no run outputs here: expected a directory written by `otb-diag energy` or "
            "`otb-diag variance-compare` (summary.json, ...) or a directory holding several",
            path=path,
            field="--current",
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


def energy_metrics(run_dir: Path, summary: dict[str, Any]) -> dict[str, Metric]:
    """Deterministic metrics of an `otb-diag energy` run."""
    values = dict(_flatten(summary.get("energy", {}), "summary/"))
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


def _read_fidelity(path: Path) -> pd.DataFrame:
    """fidelity.csv; a proxy-only run writes it without rows (or even a header)."""
    try:
        return pd.read_csv(path)
    except pd.errors.EmptyDataError:
        return pd.DataFrame()


def variance_metrics(run_dir: Path, summary: dict[str, Any]) -> dict[str, Metric]:
    """Statistical metrics of variance.csv (with intervals) and deterministic fidelity ones."""
    from otb_diag.variance import REFERENCE

    path = run_dir / "variance.csv"
    table = _require(_read(path, pd.read_csv), VARIANCE_COLUMNS, path)
    k = int(summary.get("settings", {}).get("sketch_dim", 0))
    if k < 1:
        raise InputError("no settings.sketch_dim in the run summary", path=run_dir / "summary.json")
    metrics: dict[str, Metric] = {}
    for step, per_step in _steps(table):
        for mode, rows in per_step.groupby("mode", sort=False):
            q_lo, q_hi = projection_factor_range(str(mode), k)
            # Intervals for the unprojected variance, from which everything else is derived.
            rows = rows.assign(ci_low=rows["ci_low"] / q_hi, ci_high=rows["ci_high"] / q_lo)
            bounds = _derived_intervals(rows, REFERENCE)
            for index, row in rows.iterrows():
                name = f"{step}{mode}/{row['aggregation']}/{row['baseline']}/N{row['group_size']}/"
                metrics[name + "variance"] = Metric(
                    "statistical",
                    float(row["variance"]),
                    (float(row["ci_low"]), float(row["ci_high"])),
                )
                for column in DERIVED:
                    metrics[name + column] = Metric(
                        "statistical", float(row[column]), bounds[column][index]
                    )
                z = float(row["bias_z"])
                metrics[name + "bias_z"] = Metric(
                    "statistical",
                    z,
                    (max(0.0, z - Z_95) / math.sqrt(q_hi), (z + Z_95) / math.sqrt(q_lo)),
                )

    fidelity = _read(run_dir / "fidelity.csv", _read_fidelity)
    for step, rows in _steps(fidelity):
        for row in rows.to_dict("records"):
            for column, value in row.items():
                if column not in ("step", "mode"):
                    metrics[f"fidelity/{step}{row['mode']}/{column}"] = Metric(
                        "deterministic", float(value)
                    )
    return metrics


def _derived_intervals(
    rows: pd.DataFrame, reference: str
) -> dict[str, dict[Any, tuple[float, float]]]:
    """Interval of each derived ratio per row of one mode's table: the range of
    `compare_to_mean` over the four corners of (this baseline's variance interval) x (the
    reference curve's intervals), and the point value itself."""
    from otb_diag.variance import compare_to_mean

    sizes = sorted(rows["group_size"].unique().tolist())
    is_reference = rows["baseline"] == reference
    corners = []
    for own, ref in product(("ci_low", "ci_high"), repeat=2):
        table = rows[["aggregation", "baseline", "group_size"]].assign(
            variance=np.where(is_reference, rows[ref], rows[own])
        )
        corners.append(compare_to_mean(table, sizes))
    bounds: dict[str, dict[Any, tuple[float, float]]] = {}
    for column in DERIVED:
        values = np.stack([rows[column].to_numpy(np.float64)] + [c[column] for c in corners])
        bounds[column] = {
            index: (float(lo), float(hi))
            for index, lo, hi in zip(rows.index, values.min(0), values.max(0), strict=True)
        }
    return bounds


@functools.cache
def projection_factor_range(mode: str, k: int) -> tuple[float, float]:
    """95 % range of the factor by which a seeded projection to k dimensions scales a squared
    norm, in the worst case (rank one): `χ²_k / k` for Gaussian projections (`proxy`, `full`),
    the product of two such factors for `head`'s Kronecker sketch. Quantiles from a fixed-seed
    Monte Carlo (one code path for both; error ~0.3 %, far below what they widen)."""
    from otb_diag.scores import kronecker_split

    rng = np.random.default_rng(0)
    factor = np.ones(200_000)
    for dim in kronecker_split(k) if mode == "head" else (k,):
        factor *= rng.chisquare(dim, factor.size) / dim
    lo, hi = np.quantile(factor, [0.025, 0.975])
    return float(lo), float(hi)


# ---------------------------------------------------------------------------------------------
# Golden files and tolerances
# ---------------------------------------------------------------------------------------------


def run_provenance(path: Path) -> dict[str, Any]:
    """What the golden was made from: per run, the command, the inputs' SHA-256 and settings
    (a golden interval is only meaningful for the same draws, bootstrap and sketch size)."""
    runs = {}
    for run_dir, summary in find_runs(path):
        inputs = summary.get("inputs", {})
        runs[run_dir.relative_to(path).as_posix()] = {
            "command": summary["command"],
            "rollouts_sha256": inputs.get("rollouts", {}).get("sha256"),
            "checkpoints_sha256": [c.get("sha256") for c in inputs.get("checkpoints", [])],
            "settings": summary.get("settings"),
        }
    return {"runs": runs}


def golden_text(metrics: Mapping[str, Metric], created_from: Mapping[str, Any]) -> str:
    """The golden file: strict JSON, one metric per line (sorted) so a diff shows what moved."""
    created = json.dumps(created_from, indent=2, allow_nan=False).replace("\n", "\n  ")
    lines = [
        f"    {json.dumps(name)}: {json.dumps(metrics[name].to_json(), allow_nan=False)}"
        for name in sorted(metrics)
    ]
    return (
        f'{{\n  "format": "{GOLDEN_FORMAT}",\n  "created_from": {created},\n'
        '  "metrics": {\n' + ",\n".join(lines) + "\n  }\n}\n"
    )


def write_golden(
    path: Path, metrics: Mapping[str, Metric], created_from: Mapping[str, Any]
) -> None:
    write_text(path, golden_text(metrics, created_from))


def load_golden(path: Path) -> dict[str, Metric]:
    """The metrics of a golden file; anything else (missing, not JSON, other format) is an
    input error naming the file."""
    data = _load_json(path, "golden file", hint="Create it with `otb-diag regress --update`.")
    if not isinstance(data, dict) or data.get("format") != GOLDEN_FORMAT:
        raise InputError(f'not a golden file: expected "format": "{GOLDEN_FORMAT}"', path=path)
    entries = data.get("metrics")
    if not isinstance(entries, dict):
        raise InputError('"metrics" must be an object of name -> metric', path=path)
    metrics = {}
    for name, entry in entries.items():
        kind = entry.get("kind") if isinstance(entry, dict) else None
        if kind not in ("deterministic", "statistical"):
            raise InputError(
                f"metric '{name}': \"kind\" must be deterministic or statistical", path=path
            )
        ci = entry.get("ci")
        if kind == "statistical" and not (isinstance(ci, list) and len(ci) == 2):
            raise InputError(
                f"metric '{name}': a statistical metric needs \"ci\": [lo, hi]", path=path
            )
        value = _number(entry.get("value"), f"metric '{name}'", path)
        if kind == "statistical":
            lo, hi = (_number(x, f"metric '{name}' ci", path) for x in ci)
            metrics[name] = Metric(kind, value, (lo, hi))
        else:
            metrics[name] = Metric(kind, value)
    return metrics


def load_tolerances(path: Path) -> list[tuple[str, Tolerance]]:
    """Override patterns in file order: `{"energy/advantages/*": {"rel": 1e-3}, ...}`. A key
    left out keeps its default value."""
    data = _load_json(path, "tolerances file")
    if not isinstance(data, dict):
        raise InputError('expected an object {"pattern": {"rel": .., "abs": ..}}', path=path)
    patterns = []
    for pattern, spec in data.items():
        if not isinstance(spec, dict) or not spec or set(spec) - {"rel", "abs"}:
            raise InputError(f'pattern \'{pattern}\': expected {{"rel": .., "abs": ..}}', path=path)
        for key, value in spec.items():
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
                raise InputError(
                    f"pattern '{pattern}': '{key}' must be a non-negative number", path=path
                )
        patterns.append(
            (
                pattern,
                Tolerance(
                    rel=float(spec.get("rel", DEFAULT_TOLERANCE.rel)),
                    abs=float(spec.get("abs", DEFAULT_TOLERANCE.abs)),
                ),
            )
        )
    return patterns


def _load_json(path: Path, what: str, hint: str | None = None) -> Any:
    if not path.is_file():
        raise InputError(f"{what} not found.", path=path, hint=hint)
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as err:
        raise InputError(f"cannot read the {what}: {err}", path=path) from None
    except json.JSONDecodeError as err:
        raise InputError(f"malformed JSON: {err.msg}", path=path, line=err.lineno) from None


def tolerance_for(name: str, overrides: Sequence[tuple[str, Tolerance]]) -> Tolerance:
    """The last override whose fnmatch pattern matches `name` (file order: put general patterns
    first, specific ones after), else the default."""
    chosen = DEFAULT_TOLERANCE
    for pattern, tolerance in overrides:
        if fnmatch.fnmatchcase(name, pattern):
            chosen = tolerance
    return chosen


# ---------------------------------------------------------------------------------------------
# Comparing
# ---------------------------------------------------------------------------------------------


def _gap(a: tuple[float, float], b: tuple[float, float]) -> float:
    """Distance between two closed intervals, 0 when they overlap (inf-safe: [5, inf] and
    [inf, inf] overlap; nan never does)."""
    if a[0] <= b[1] and b[0] <= a[1]:
        return 0.0
    return b[0] - a[1] if b[0] > a[1] else a[0] - b[1]


def check(name: str, golden: Metric, current: Metric, tolerance: Tolerance) -> Row:
    """Pass when the distance between the two intervals (points for deterministic metrics) is
    within the tolerance; nan passes only against nan."""
    if golden.kind != current.kind:
        message = f"kind changed from {golden.kind} to {current.kind}"
        return Row(name, "fail", golden, current, tolerance, message)
    if math.isnan(golden.value) and math.isnan(current.value):
        return Row(name, "pass", golden, current, tolerance)
    gap = _gap(golden.interval(), current.interval())
    allowed = tolerance.allowed(golden.value, current.value)
    if gap <= allowed:
        return Row(name, "pass", golden, current, tolerance)
    if golden.kind == "statistical":
        message = f"95% intervals {golden.ci} and {current.ci} do not overlap (gap {gap:.3g})"
    else:
        message = f"|current - golden| = {gap:.3g} > {allowed:.3g} allowed ({tolerance})"
    return Row(name, "fail", golden, current, tolerance, message)


def compare(
    golden: Mapping[str, Metric],
    current: Mapping[str, Metric],
    tolerances: Sequence[tuple[str, Tolerance]] = (),
) -> list[Row]:
    """One row per metric name in either mapping, sorted by name. A metric only in the golden
    is `missing`, one only in the current run `extra`: both count as failures, because either
    the run no longer measures what it used to or the golden no longer describes the run (add
    new metrics deliberately with `--update`)."""
    rows = []
    for name in sorted(golden.keys() | current.keys()):
        tolerance = tolerance_for(name, tolerances)
        if name not in current:
            rows.append(Row(name, "missing", golden[name], None, tolerance, "not in the run"))
        elif name not in golden:
            message = "not in the golden file (add it with --update)"
            rows.append(Row(name, "extra", None, current[name], tolerance, message))
        else:
            rows.append(check(name, golden[name], current[name], tolerance))
    return rows


def counts(rows: Sequence[Row]) -> dict[str, int]:
    return {s: sum(r.status == s for r in rows) for s in ("pass", "fail", "missing", "extra")}


def format_rows(rows: Sequence[Row], *, every: bool = False) -> str:
    """A table of the non-passing rows (every row with `every`), then a count line."""
    shown = [r for r in rows if every or r.status != "pass"]
    table = [("metric", "golden", "current", "tolerance", "status")] + [
        (r.name, str(r.golden or "-"), str(r.current or "-"), r.tolerance_text(), r.status)
        for r in shown
    ]
    widths = [max(len(line[i]) for line in table) for i in range(5)]
    lines = [
        "  ".join(cell.ljust(w) for cell, w in zip(line, widths, strict=True)).rstrip()
        for line in (table if shown else [])
    ]
    c = counts(rows)
    lines.append(
        f"{len(rows)} metrics: {c['pass']} pass, {c['fail']} fail, {c['missing']} missing, "
        f"{c['extra']} extra"
    )
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# --update and JUnit
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Change:
    what: Literal["added", "removed", "changed"]
    name: str
    old: Metric | None
    new: Metric | None


def golden_changes(old: Mapping[str, Metric], new: Mapping[str, Metric]) -> list[Change]:
    """What rewriting the golden `old` with `new` changes (compared as stored, so nan == nan)."""
    changes = []
    for name in sorted(old.keys() | new.keys()):
        if name not in new:
            changes.append(Change("removed", name, old[name], None))
        elif name not in old:
            changes.append(Change("added", name, None, new[name]))
        elif old[name].to_json() != new[name].to_json():
            changes.append(Change("changed", name, old[name], new[name]))
    return changes


def format_changes(changes: Sequence[Change]) -> str:
    lines = []
    for c in changes:
        if c.what == "changed":
            lines.append(f"changed  {c.name}: {c.old} -> {c.new}")
        elif c.what == "added":
            lines.append(f"added    {c.name}: {c.new}")
        else:
            lines.append(f"removed  {c.name}: {c.old}")
    return "\n".join(lines)


def junit_xml(rows: Sequence[Row]) -> str:
    """One JUnit testcase per metric; fail, missing and extra become <failure> elements."""
    failing = [r for r in rows if r.status != "pass"]
    suite = ET.Element(
        "testsuite",
        name="otb-diag regress",
        tests=str(len(rows)),
        failures=str(len(failing)),
        errors="0",
        skipped="0",
    )
    for row in rows:
        case = ET.SubElement(suite, "testcase", classname="otb-diag.regress", name=row.name)
        if row.status != "pass":
            failure = ET.SubElement(case, "failure", message=f"{row.status}: {row.message}")
            failure.text = (
                f"golden:    {row.golden or '-'}\ncurrent:   {row.current or '-'}\n"
                f"tolerance: {row.tolerance_text()}"
            )
    root = ET.Element("testsuites", tests=str(len(rows)), failures=str(len(failing)))
    root.append(suite)
    ET.indent(root)
    return '<?xml version="1.0" encoding="utf-8"?>\n' + ET.tostring(root, "unicode") + "\n"


def write_junit(path: Path, rows: Sequence[Row]) -> None:
    write_text(path, junit_xml(rows))
