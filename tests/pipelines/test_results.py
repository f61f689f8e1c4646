"""The typed results of `energy` and `variance-compare`: summary.json is exactly `to_json()`
(a schema version first), reads back into an equal object, prints what the CLI prints, and an
unversioned or other-version file is refused with the file named and what to do."""

import ast
import json
import shutil
from pathlib import Path

import pytest
from otb_diag.cli.main import app
from typer.testing import CliRunner

from otb_diag.errors import InputError
from otb_diag.pipelines.results.dynamics import DynamicsResult
from otb_diag.pipelines.results.energy import EnergyResult
from otb_diag.pipelines.results.figures import FiguresResult
from otb_diag.pipelines.results.read import read_summary
from otb_diag.pipelines.results.report import ReportResult
from otb_diag.pipelines.results.schema import SCHEMA_VERSION
from otb_diag.pipelines.results.train import TrainResult
from otb_diag.pipelines.results.variance import ClaimVerdict, VarianceResult

ROOT = Path(__file__).resolve().parents[2]
runner = CliRunner()


@pytest.mark.parametrize(("run", "cls"), [("energy", EnergyResult), ("variance", VarianceResult)])
def test_summary_json_round_trips(runs: Path, run: str, cls: type) -> None:
    path = runs / run / "summary.json"
    written = json.loads(path.read_text(encoding="utf-8"))
    result = read_summary(runs / run)
    assert isinstance(result, cls)
    assert result.to_json() == written
    # The version leads, then the command, then the fields in declaration order.
    assert list(written)[:2] == ["schema_version", "command"]
    assert written["schema_version"] == SCHEMA_VERSION and written["command"] == cls.command
    assert read_summary(path) == result  # the file or its directory


def test_format_reads_the_fields(runs: Path) -> None:
    energy = read_summary(runs / "energy")
    assert isinstance(energy, EnergyResult)
    text = energy.format()
    assert f"mean W(τ) {energy.energy.sequence_energy_mean:.3g}" in text
    assert f"{energy.totals.responses} responses in {energy.totals.groups} groups" in text
    assert f"wrote {len(energy.outputs)} files to {energy.out}" in text
    variance = read_summary(runs / "variance")
    assert isinstance(variance, VarianceResult)
    text = variance.format()
    for claim in variance.paper_claim:
        assert f"{claim.mode}: {claim.verdict}: {claim.text}." in text
    assert f"recommendation: {variance.recommendation}" in text
    assert len(text.splitlines()) > len(variance.headline) + len(variance.knee.rows)


@pytest.mark.parametrize("version", [None, 0, SCHEMA_VERSION + 1])
def test_other_versions_are_refused_by_name(
    runs: Path, tmp_path: Path, version: int | None
) -> None:
    old = tmp_path / "old"
    shutil.copytree(runs / "variance", old)
    data = json.loads((old / "summary.json").read_text(encoding="utf-8"))
    if version is None:
        del data["schema_version"]
    else:
        data["schema_version"] = version
    (old / "summary.json").write_text(json.dumps(data), encoding="utf-8")
    with pytest.raises(InputError) as caught:
        read_summary(old)
    assert caught.value.path == old / "summary.json"
    assert "Re-run `otb-diag variance-compare`" in str(caught.value)
    # report and regress read through the same reader: exit 2, the file named, nothing written
    out = tmp_path / "r.html"
    result = runner.invoke(app, ["report", str(old), "--out", str(out)])
    assert result.exit_code == 2 and str(old / "summary.json") in result.stderr
    assert not out.exists()
    golden = ROOT / "tests" / "golden" / "energy_variance.json"
    result = runner.invoke(app, ["regress", "--golden", str(golden), "--current", str(old)])
    assert result.exit_code == 2 and "schema_version" in result.stderr


def test_a_missing_field_is_an_input_error(runs: Path, tmp_path: Path) -> None:
    data = json.loads((runs / "energy" / "summary.json").read_text(encoding="utf-8"))
    del data["totals"]["groups"]
    path = tmp_path / "summary.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    with pytest.raises(InputError, match="lacks a field") as caught:
        read_summary(path)
    assert caught.value.path == path


def test_committed_figures_json_is_what_the_result_writes() -> None:
    """figures.json carries no schema version: the typed result writes the committed file's
    content, key for key and in order."""
    record = json.loads((ROOT / "figures" / "figures.json").read_text(encoding="utf-8"))
    claims = [ClaimVerdict(**c) for c in record["paper_claim"]]
    written = FiguresResult(**{**record, "paper_claim": claims}).to_json()
    assert written == record and list(written) == list(record)


# The top-level keys of every result (summary.json, train.json, collapse.json, report --json):
# outside the result classes, nothing reads them by key.
RESULT_CLASSES = (
    *(EnergyResult, VarianceResult, TrainResult, DynamicsResult, ReportResult, FiguresResult),
)
SUMMARY_KEYS = {"schema_version", "command"} | {
    f for cls in RESULT_CLASSES for f in cls.__dataclass_fields__
}


def _keyed_reads(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, key) of every `x["key"]` and `x.get("key")` whose `x` names a summary or a
    result and whose key is a summary.json field."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Subscript):
            base, key = node.value, node.slice
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "get"
            and node.args
        ):
            base, key = node.func.value, node.args[0]
        else:
            continue
        named = ast.unparse(base).lower()
        if (
            isinstance(key, ast.Constant)
            and key.value in SUMMARY_KEYS
            and ("summary" in named or "result" in named)
        ):
            found.append((node.lineno, key.value))
    return found


def test_no_module_outside_the_results_reads_a_summary_by_key() -> None:
    files = [*(ROOT / "otb_diag").rglob("*.py"), *(ROOT / "cli").glob("*.py")]
    results = ROOT / "otb_diag" / "pipelines" / "results"
    bad = [
        f"{path.relative_to(ROOT)}:{line} reads summary['{key}']"
        for path in files
        if results not in path.parents
        for line, key in _keyed_reads(ast.parse(path.read_text(encoding="utf-8")))
    ]
    assert not bad, "\n".join(bad)


def test_the_scan_sees_a_keyed_read() -> None:
    """The scan is not vacuous: it flags the reads it is meant to flag."""
    code = 'a = summary["headline"]\nb = run.result.get("knee")\nc = frame["mode"]\n'
    assert _keyed_reads(ast.parse(code)) == [(1, "headline"), (2, "knee")]
