"""`otb-diag regress`: the project's own regression test on a reduced embedded default, and unit
tests of the comparison rules.

The golden file tests/golden/energy_variance.json comes from the runs of the `runs` fixture;
after a deliberate change of the numbers, regenerate it with

    OTB_DIAG_UPDATE_GOLDEN=1 PYTHONPATH=. pytest tests/test_regress.py -k committed_golden

and commit it with the change that explains it.
"""

import functools
import json
import math
import os
import shutil
import xml.etree.ElementTree as ET
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from otb_diag.cli.main import app
from small_runs import invoke, run_energy, run_variance
from torch import Tensor
from typer.testing import CliRunner

from otb_diag.maths.estimators import registry
from otb_diag.pipelines.regress import golden as regress
from otb_diag.pipelines.regress.golden import DEFAULT_TOLERANCE, Tolerance, compare
from otb_diag.pipelines.regress.run_metrics import Metric, collect_metrics

runner = CliRunner()

GOLDEN = Path(__file__).resolve().parents[1] / "golden" / "energy_variance.json"


def copy_run(runs: Path, dest: Path, *names: str) -> None:
    for name in names:
        shutil.copytree(runs / name, dest / name)


# ---------------------------------------------------------------------------------------------
# The regression test itself, and proof that it can fail
# ---------------------------------------------------------------------------------------------


def test_reduced_default_matches_committed_golden(runs: Path) -> None:
    update = ["--update"] if os.environ.get("OTB_DIAG_UPDATE_GOLDEN") else []
    code, output = invoke("regress", "--golden", GOLDEN, "--current", runs, *update)
    assert code == 0, output
    names = regress.load_golden(GOLDEN)
    # Every kind of metric is there.
    for expected in (
        "energy/summary/sequence_energy_mean",
        "energy/proxies/otb/proxy2_total_power",
        "energy/advantages/otb/mean_abs",
        "energy/sequences/energy_median",
        "variance/full/token-sum/otb/N4/variance",
        "variance/full/token-sum/otb/N4/equivalent_mean_group_size",
        "variance/fidelity/full/token_spearman",
    ):
        assert expected in names


def flip_largest_advantage(fn: registry.BaselineFn) -> registry.BaselineFn:
    """`fn` with the sign of its largest |advantage| on a generated token flipped."""

    @functools.wraps(fn)  # keeps the signature the registry reads the options from
    def flipped(returns: Tensor, mask: Tensor, *args: Any, **kwargs: Any) -> Tensor:
        adv = fn(returns, mask, *args, **kwargs).clone()
        flat = (adv.abs() * mask).argmax()
        adv.view(-1)[flat] = -adv.view(-1)[flat]
        return adv

    return flipped


@pytest.mark.slow  # runs a command end to end (a real run: seconds)
def test_a_flipped_advantage_fails(
    runs: Path, reduced_rollouts: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    otb = registry.BASELINES["otb"]
    monkeypatch.setitem(registry.BASELINES, "otb", replace(otb, fn=flip_largest_advantage(otb.fn)))
    run_energy(reduced_rollouts, tmp_path / "energy")
    copy_run(runs, tmp_path, "variance")
    monkeypatch.undo()

    code, output = invoke("regress", "--golden", GOLDEN, "--current", tmp_path)
    assert code == 1
    for moved in ("energy/advantages/otb/mean", "energy/proxies/otb/proxy2_total_power"):
        assert f"{moved} " in output

    # Only otb moved, and everything else is bit for bit what the unperturbed run gave: the
    # deterministic metrics need no tolerance for a rerun on one machine.
    before, after = collect_metrics(runs), collect_metrics(tmp_path)
    moved_names = {name for name in before if before[name] != after[name]}
    assert moved_names and all("/otb/" in name for name in moved_names)


def test_a_shifted_variance_fails(runs: Path, tmp_path: Path) -> None:
    copy_run(runs, tmp_path, "energy", "variance")
    path = tmp_path / "variance" / "variance.csv"
    table = pd.read_csv(path)
    otb = table["baseline"] == "otb"
    # Ten-fold: at k = 32 the seeded projection alone may move a variance ~1.5x either way, so
    # the intervals let through shifts up to ~3.5x (see otb_diag/pipelines/run_metrics.py).
    table.loc[otb, ["variance", "ci_low", "ci_high"]] *= 10
    table.to_csv(path, index=False)

    code, output = invoke("regress", "--golden", GOLDEN, "--current", tmp_path, "--json")
    assert code == 1
    failing = {r["metric"] for r in json.loads(output)["rows"] if r["status"] != "pass"}
    assert "variance/full/token-sum/otb/N4/variance" in failing
    assert all("/otb/" in name for name in failing)


@pytest.mark.slow  # runs a command end to end (a real run: seconds)
def test_a_reseeded_variance_run_passes(runs: Path, reduced_rollouts: Path, tmp_path: Path) -> None:
    run_variance(reduced_rollouts, tmp_path / "variance", seed=1)
    copy_run(runs, tmp_path, "energy")
    code, output = invoke("regress", "--golden", GOLDEN, "--current", tmp_path, "--json")
    assert code == 0, output
    rows = json.loads(output)["rows"]
    statistical = [r for r in rows if r["golden"]["kind"] == "statistical"]
    assert len(statistical) > 400 and all(r["status"] == "pass" for r in statistical)
    # The seed did move the numbers: the intervals, not luck, make it pass.
    moved = [r for r in statistical if r["golden"]["value"] != r["current"]["value"]]
    assert len(moved) > 100


# ---------------------------------------------------------------------------------------------
# JUnit, --update, bad input
# ---------------------------------------------------------------------------------------------


def edited_golden(dest: Path, source: Path = GOLDEN) -> Path:
    """`source` (the committed golden by default) with one value moved, one metric dropped and
    one invented, written to `dest`."""
    data = json.loads(source.read_text(encoding="utf-8"))
    metrics = data["metrics"]
    metrics["energy/summary/mean_w"]["value"] *= 2
    del metrics["energy/advantages/otb/max"]
    metrics["energy/proxies/otb/made_up"] = {"kind": "deterministic", "value": 1.0}
    dest.write_text(json.dumps(data), encoding="utf-8")
    return dest


def test_junit_report_counts_failures(runs: Path, tmp_path: Path) -> None:
    golden = edited_golden(tmp_path / "golden.json")
    report = tmp_path / "reports" / "regress.xml"
    code, output = invoke(
        "regress", "--golden", golden, "--current", runs, "--junit", report, "--all"
    )
    assert code == 1
    assert "energy/summary/mean_w" in output and "energy/summary/step" in output  # --all

    suite = ET.parse(report).getroot().find("testsuite")
    assert suite is not None
    cases = suite.findall("testcase")
    assert int(suite.get("tests", "0")) == len(cases) > 400
    failures = {c.get("name"): c.find("failure") for c in cases if c.find("failure") is not None}
    assert int(suite.get("failures", "0")) == len(failures) == 3
    assert failures["energy/summary/mean_w"].get("message", "").startswith("fail:")
    assert failures["energy/advantages/otb/max"].get("message", "").startswith("extra:")
    assert failures["energy/proxies/otb/made_up"].get("message", "").startswith("missing:")


@pytest.mark.slow  # runs a command end to end (a real run: seconds)
def test_update_writes_atomically_and_reports_changes(
    runs: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    golden = tmp_path / "golden.json"
    code, output = invoke("regress", "--golden", golden, "--current", runs, "--update")
    assert code == 0 and output.startswith(f"created {golden} with ")
    assert regress.load_golden(golden) == collect_metrics(runs)

    edited_golden(golden, source=golden)  # exactly 3 changes, whatever this machine's rounding
    code, output = invoke("regress", "--golden", golden, "--current", runs, "--update")
    assert code == 0
    lines = output.splitlines()
    assert any(
        line.startswith("changed  energy/summary/mean_w: ") and " -> " in line for line in lines
    )
    assert "added    energy/advantages/otb/max: " in output
    assert "removed  energy/proxies/otb/made_up: 1" in output
    assert lines[-1].endswith("3 changed")
    assert invoke("regress", "--golden", golden, "--current", runs)[0] == 0

    # A failure while writing leaves the old golden whole and no temporary file behind.
    before = golden.read_bytes()

    def full_disk(*_: object) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", full_disk)
    crash = tmp_path.parent / f"{tmp_path.name}-crash"  # where the traceback is saved
    crash.mkdir()
    monkeypatch.setattr("tempfile.tempdir", str(crash))
    result = runner.invoke(
        app, ["regress", "--golden", str(golden), "--current", str(runs / "energy"), "--update"]
    )
    assert result.exit_code == 3 and "OSError: disk full" in result.stderr  # one paragraph
    assert len(list(crash.iterdir())) == 1
    assert golden.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["golden.json"]


@pytest.mark.parametrize(
    ("golden_text", "current", "message"),
    [
        (None, "runs", "golden file not found"),
        ('{"format": "otb-diag-golden/1", "metrics": {', "runs", "line 1"),
        ('{"command": "energy"}', "runs", "not a golden file"),
        ('{"format": "otb-diag-golden/1", "metrics": {}}', "empty", "no run outputs here"),
        ('{"format": "otb-diag-golden/1", "metrics": {}}', "nowhere", "no such file"),
    ],
)
def test_bad_input_exits_2(
    runs: Path, tmp_path: Path, golden_text: str | None, current: str, message: str
) -> None:
    golden = tmp_path / "golden.json"
    if golden_text is not None:
        golden.write_text(golden_text, encoding="utf-8")
    (tmp_path / "empty").mkdir()
    current_path = runs if current == "runs" else tmp_path / current
    result = runner.invoke(
        app, ["regress", "--golden", str(golden), "--current", str(current_path)]
    )
    assert result.exit_code == 2
    assert message in result.stderr


def test_bad_tolerances_exit_2(runs: Path, tmp_path: Path) -> None:
    path = tmp_path / "tolerances.json"
    path.write_text('{"energy/*": {"rel": -1}}', encoding="utf-8")
    result = runner.invoke(
        app, ["regress", "--golden", str(GOLDEN), "--current", str(runs), "--tolerances", str(path)]
    )
    assert result.exit_code == 2 and "non-negative" in result.stderr


# ---------------------------------------------------------------------------------------------
# compare() on hand-made metrics
# ---------------------------------------------------------------------------------------------


def det(value: float) -> Metric:
    return Metric("deterministic", value)


def stat(value: float, lo: float, hi: float) -> Metric:
    return Metric("statistical", value, (lo, hi))


def status(
    golden: Metric, current: Metric, tolerances: Sequence[tuple[str, Tolerance]] = ()
) -> str:
    return compare({"m": golden}, {"m": current}, tolerances)[0].status


@pytest.mark.parametrize(
    ("golden", "current", "expected"),
    [
        (1.0, 1.0 + 0.99e-4, "pass"),  # inside rel 1e-4
        (1.0, 1.0 + 1.01e-4, "fail"),
        (0.0, 0.99e-6, "pass"),  # abs 1e-6 near zero
        (0.0, 1.01e-6, "fail"),
        (-2.0, 2.0, "fail"),  # a sign flip
        (math.inf, math.inf, "pass"),
        (math.inf, -math.inf, "fail"),
        (5.0, math.inf, "fail"),  # inf must not make the relative allowance infinite
        (math.nan, math.nan, "pass"),
        (math.nan, 1.0, "fail"),
    ],
)
def test_deterministic_tolerance(golden: float, current: float, expected: str) -> None:
    assert status(det(golden), det(current)) == expected


@pytest.mark.parametrize(
    ("golden", "current", "expected"),
    [
        (stat(1.0, 0.8, 1.2), stat(1.5, 1.1, 1.9), "pass"),  # overlap
        (stat(1.0, 0.8, 1.2), stat(1.4, 1.2, 1.6), "pass"),  # touching
        (stat(1.0, 0.8, 1.2), stat(1.6, 1.3, 1.9), "fail"),  # disjoint
        (stat(1.0, 0.8, 1.2), stat(0.5, 0.3, 0.7), "fail"),  # disjoint below
        (stat(math.inf, 8.0, math.inf), stat(math.inf, 10.0, math.inf), "pass"),
        (stat(math.inf, math.inf, math.inf), stat(math.inf, math.inf, math.inf), "pass"),
        (stat(math.inf, math.inf, math.inf), stat(5.0, 4.0, 6.0), "fail"),
        (stat(9.0, 6.0, math.inf), stat(5.0, 4.0, 6.0), "pass"),
    ],
)
def test_statistical_interval_overlap(golden: Metric, current: Metric, expected: str) -> None:
    assert status(golden, current) == expected


def test_missing_and_extra_fail() -> None:
    rows = compare({"a": det(1.0), "b": det(2.0)}, {"b": det(2.0), "c": det(3.0)})
    assert [(r.name, r.status) for r in rows] == [("a", "missing"), ("b", "pass"), ("c", "extra")]
    assert regress.counts(rows) == {"pass": 1, "fail": 0, "missing": 1, "extra": 1}
    assert regress.format_rows(rows).splitlines()[-1] == (
        "3 metrics: 1 pass, 0 fail, 1 missing, 1 extra"
    )


def test_last_matching_pattern_wins(tmp_path: Path) -> None:
    loose, exact = Tolerance(rel=1e-2, abs=0.0), Tolerance(rel=0.0, abs=0.0)
    name = "energy/advantages/otb/mean"
    assert regress.tolerance_for(name, [("energy/*", loose), ("*/otb/*", exact)]) == exact
    assert regress.tolerance_for(name, [("*/otb/*", exact), ("energy/*", loose)]) == loose
    assert regress.tolerance_for("variance/x", [("energy/*", loose)]) == DEFAULT_TOLERANCE
    assert status(det(1.0), det(1.005), [("*", loose)]) == "pass"
    assert status(det(1.0), det(1.005)) == "fail"

    path = tmp_path / "tolerances.json"
    path.write_text('{"energy/*": {"rel": 0.01}, "*/mean": {"abs": 0.5}}', encoding="utf-8")
    patterns = regress.load_tolerances(path)
    assert patterns == [
        ("energy/*", Tolerance(rel=0.01, abs=DEFAULT_TOLERANCE.abs)),
        ("*/mean", Tolerance(rel=DEFAULT_TOLERANCE.rel, abs=0.5)),  # a left-out key: default
    ]
    assert regress.tolerance_for(name, patterns).abs == 0.5


def test_golden_round_trip_keeps_non_finite_values(tmp_path: Path) -> None:
    metrics = {
        "a": det(0.1 + 0.2),
        "b": stat(math.inf, 3.0, math.inf),
        "c": det(-math.inf),
        "d": stat(1.0, 0.5, 2.0),
    }
    path = tmp_path / "g.json"
    regress.write_golden(path, metrics, {"runs": {}})
    assert regress.load_golden(path) == metrics
    assert '"value": "inf"' in path.read_text(encoding="utf-8")
    regress.write_golden(path, {"n": det(math.nan)}, {})  # nan != nan: checked apart
    assert math.isnan(regress.load_golden(path)["n"].value)
