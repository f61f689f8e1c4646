"""Regression checks on the numbers `otb-diag energy` and `otb-diag variance-compare` write, so
CI fails when a change to a trainer, tokenizer or sampler moves the variance picture.

A run directory is turned into flat metrics, `name -> Metric` (`run_metrics`, which also says
how each statistical metric's 95 % interval is made), and compared with a golden file:
- deterministic metrics pass when `|current - golden| <= max(abs, rel * max(|current|,
  |golden|))` (`math.isclose`'s rule) with the defaults `DEFAULT_TOLERANCE` or the override
  file's last matching pattern;
- statistical metrics pass when the golden and current intervals overlap (within the same
  tolerance, which is negligible by default).
Non-finite values (`inf` = beyond the measured range, `nan`) pass only against the same value.
"""

from __future__ import annotations

import fnmatch
import json
import math
import xml.etree.ElementTree as ET
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from otb_diag.errors import InputError, json_problem
from otb_diag.io.atomic import write_text
from otb_diag.pipelines.regress.run_metrics import Metric, find_runs
from otb_diag.pipelines.results.schema import plain

GOLDEN_FORMAT = "otb-diag-golden/1"
Status = Literal["pass", "fail", "missing", "extra"]


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
# Golden files and tolerances
# ---------------------------------------------------------------------------------------------


def run_provenance(path: Path) -> dict[str, Any]:
    """What the golden was made from: per run, the command, the inputs' SHA-256 and settings
    (a golden interval is only meaningful for the same draws, bootstrap and sketch size)."""
    runs = {}
    for run_dir, command, result in find_runs(path):
        runs[run_dir.relative_to(path).as_posix()] = {
            "command": command,
            "rollouts_sha256": result.inputs.rollouts_sha256,
            "checkpoints_sha256": [c.sha256 for c in result.inputs.checkpoints],
            "settings": plain(result.settings),
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
        raise InputError(
            f"malformed JSON: {json_problem(err)}", path=path, line=err.lineno
        ) from None


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


def _junit_xml(rows: Sequence[Row]) -> str:
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
    write_text(path, _junit_xml(rows))
