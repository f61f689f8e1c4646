"""The typed results of `energy` and `variance-compare`: summary.json is exactly `to_json()`
(a schema version first), reads back into an equal object, prints what the CLI prints, and an
unversioned or other-version file is refused with the file named and what to do."""

import ast
import dataclasses
import json
import re
import shutil
import typing
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from otb_diag.cli.main import app
from typer.testing import CliRunner

from otb_diag.dynamics.detection_rule import DetectionRule
from otb_diag.errors import InputError
from otb_diag.pipelines.regress.run_metrics import find_runs
from otb_diag.pipelines.results import schema
from otb_diag.pipelines.results.dynamics import (
    DynamicsArm,
    DynamicsResult,
    DynamicsRun,
    PooledBudget,
)
from otb_diag.pipelines.results.energy import AdvantageAudit, AuditSkipped, EnergyResult
from otb_diag.pipelines.results.figures import FiguresResult, Sweep, SweepRun
from otb_diag.pipelines.results.inspect import InspectResult
from otb_diag.pipelines.results.read import Result
from otb_diag.pipelines.results.report import ReportedRun, ReportResult, Verdict
from otb_diag.pipelines.results.sample import SampleResult
from otb_diag.pipelines.results.schema import SCHEMA_VERSION, Distributed, FileRecord, build
from otb_diag.pipelines.results.train import TrainResult, TrainTotals
from otb_diag.pipelines.results.variance import (
    FullMode,
    Recommendation,
    VarianceResult,
)
from otb_diag.pipelines.train_settings import TrainSettings

ROOT = Path(__file__).resolve().parents[2]
runner = CliRunner()


def read_run(run_dir: Path) -> Result:
    """The result of the one run in `run_dir`, read back as `report` and `regress` read it
    (`find_runs`: its summary.json through `results/read.py:result_from_json`)."""
    ((_, _, result),) = find_runs(run_dir)
    return result


@pytest.mark.parametrize(("run", "cls"), [("energy", EnergyResult), ("variance", VarianceResult)])
def test_summary_json_round_trips(runs: Path, run: str, cls: type) -> None:
    path = runs / run / "summary.json"
    written = json.loads(path.read_text(encoding="utf-8"))
    result = read_run(runs / run)
    assert isinstance(result, cls)
    assert result.to_json() == written
    # The version leads, then the command, then the fields in declaration order.
    assert list(written)[:2] == ["schema_version", "command"]
    assert written["schema_version"] == SCHEMA_VERSION and written["command"] == cls.command


def test_format_reads_the_fields(runs: Path) -> None:
    energy = read_run(runs / "energy")
    assert isinstance(energy, EnergyResult)
    text = energy.format()
    assert f"mean W(τ) {energy.energy.sequence_energy_mean:.3g}" in text
    assert f"{energy.totals.responses} responses in {energy.totals.groups} groups" in text
    assert f"wrote {len(energy.outputs)} files to {energy.out}" in text
    variance = read_run(runs / "variance")
    assert isinstance(variance, VarianceResult)
    text = variance.format()
    for claim in variance.paper_claim:
        assert f"paper's claim, {claim.mode} mode: {claim.text}." in text
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
        read_run(old)
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
        read_run(tmp_path)
    assert caught.value.path == path


SAMPLED = SampleResult(
    checkpoint="/c",
    prompts="/p.jsonl",
    prompts_sha256=None,
    prompts_count=3,
    responses=12,
    settings={"n": 4, "seed": 0, "from_policy": True},
    batches=2,
    truncated=1,
    mean_reward=0.25,
    generated_tokens=96,
    seconds=1.25,
    sampled_tokens_this_run=40,
    distributed=Distributed(world_size=2, rank_tokens=[24, 16]),
    versions={"torch": "2"},
)


def test_sample_manifest_round_trips_and_prints_its_fields(tmp_path: Path) -> None:
    """manifest.json is `to_json()`: the version first, then the command, then the fields in
    the order the unversioned manifest had them; it reads back into an equal result."""
    written = json.loads(json.dumps(SAMPLED.to_json()))
    assert list(written)[:4] == ["schema_version", "command", "checkpoint", "prompts"]
    assert written["command"] == "rollouts sample"
    assert written["distributed"] == {"world_size": 2, "rank_tokens": [24, 16]}
    assert SampleResult.from_json(written, tmp_path / "manifest.json") == SAMPLED
    assert SAMPLED.format(tmp_path) == (
        "sampled 12 responses to 3 prompts (96 tokens, 1 truncated) in 1.2 s; mean reward "
        f"0.250\nwrote {tmp_path / 'rollouts.jsonl'} and {tmp_path / 'manifest.json'}"
    )


def test_an_unversioned_sample_manifest_is_refused(tmp_path: Path) -> None:
    old = SAMPLED.to_json()
    del old["schema_version"]  # a manifest.json written before records had a version
    with pytest.raises(InputError, match="no schema_version") as caught:
        SampleResult.from_json(old, tmp_path / "manifest.json")
    assert "Re-run `otb-diag rollouts sample`" in str(caught.value)


def _run(name: str, otb: dict[str, float] | None) -> DynamicsRun:
    return DynamicsRun(
        *(name, f"/{name}.jsonl", "otb-diag", "otb", 4, 40, 1, 40, 0.5, 30, 6.1, 22, 8),
        *("proxy2_total_power", None, False, None),
        otb=otb,
    )


def test_collapse_rows_are_records_and_otb_appears_only_when_logged(tmp_path: Path) -> None:
    """collapse.json's rows read back as `DynamicsRun`; a run without the live diagnostics has
    no "otb" key, as before the rows were typed."""
    live = _run("live", {"otb/energy/sequence_mean": 2.5})
    runs = [_run("plain", None), live]
    result = DynamicsResult(rule=DetectionRule(), target=None, runs=runs, outputs="/o")
    written = json.loads(json.dumps(result.to_json()))
    plain_row, live_row = written["runs"]
    assert "otb" not in plain_row and live_row["otb"] == {"otb/energy/sequence_mean": 2.5}
    assert list(live_row)[:3] == ["run", "file", "source"]
    back = DynamicsResult.from_json(written, tmp_path / "collapse.json")
    assert back == result and back.live_runs == [live]
    assert "plain" in result.format() and "4 figures" in result.format()


def test_dynamics_says_each_file_it_wrote_and_a_log_without_live_keys() -> None:
    """The "wrote" line names budget.csv where a split pooled and comparison.csv with arms; a
    run whose log holds no otb/ key says that the live diagnostics were off."""
    budget = PooledBudget("otb", 40, "B ~ 12 prompts", {"noise_scale": 12.0}, {})
    arm = DynamicsArm("a", "otb", 4, ["a"], [None], 0, [1e5], 1, 1e5, None, None, 0.5, None, None)
    live = replace(_run("live", {"otb/x": 1.0}), budget=[budget])
    both = DynamicsResult(DetectionRule(), None, [live, _run("plain", None)], "/o", [arm])
    text = both.format()
    assert "wrote dynamics.csv, budget.csv, comparison.csv, collapse.json and 7 figures" in text
    assert (
        "run plain: no otb/ keys: the otb-diag live diagnostics were not attached or were "
        "switched off, so there is no noise split to pool." in text
    )
    assert "run live" not in text and "runs plain and live" not in text
    alone = DynamicsResult(DetectionRule(), None, [_run("plain", None)], "/o").format()
    assert "wrote dynamics.csv, collapse.json and 3 figures" in alone


def test_dynamics_names_the_runs_without_live_keys_once_and_no_target_no_column() -> None:
    """Twelve runs of three arms without the live diagnostics: one line names them (a line a
    run before); no --target: no "tokens to target" column of dashes, in the runs' table or the
    arms'."""
    runs = [_run(f"grpo N=4#{k}", None) for k in range(1, 13)]
    arm = DynamicsArm("grpo N=4", "grpo", 4, [r.run for r in runs], [None] * 12, 0, [None] * 12,
                      0, None, None, None, 0.5, 0.4, 0.6)  # fmt: skip
    text = DynamicsResult(DetectionRule(), None, runs, "/o", [arm]).format()
    assert text.count("no otb/ keys") == 1
    assert "runs grpo N=4#1, grpo N=4#2, grpo N=4#3, grpo N=4#4 and 8 more: no otb/ keys" in text
    assert "tokens to" not in text.splitlines()[0] and "reached" not in text
    assert "—" not in "\n".join(text.splitlines()[1:13])  # no column of dashes
    with_target = DynamicsResult(DetectionRule(), 0.5, runs[:1], "/o").format()
    assert "tokens to 0.5" in with_target.splitlines()[0]


# Every result (summary.json, train.json, collapse.json, manifest.json, report and inspect
# --json) and the records nested in it: outside the result classes, nothing reads their fields
# by key.
RESULT_CLASSES = (
    *(EnergyResult, VarianceResult, TrainResult, DynamicsResult, ReportResult, FiguresResult),
    *(InspectResult, SampleResult),
)


def _records(tp: Any) -> Iterator[type]:
    """`tp` and every dataclass its fields hold (directly, in a list or as `X | None`)."""
    if dataclasses.is_dataclass(tp) and isinstance(tp, type):
        yield tp
        for hint in typing.get_type_hints(tp).values():
            yield from _records(hint)
    for arg in typing.get_args(tp):
        yield from _records(arg)


SUMMARY_KEYS = {"schema_version", "command"} | {
    f.name for cls in RESULT_CLASSES for record in _records(cls) for f in dataclasses.fields(record)
}
# An expression naming a summary or a result: `summary`, `run.result`, `results[run]`.
_NAMES_A_RESULT = re.compile(r"\w*(summary|result)\w*(\[[^\]]*\])?$")


def _keyed_reads(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, key) of every `x["key"]` and `x.get("key")` whose key is a field of a result or of
    a record in it, and whose `x` names a summary or a result, or is a row of one (the target
    of a loop over an expression that names one: `for r in result.runs`)."""
    rows = {
        node.target.id
        for node in ast.walk(tree)
        if isinstance(node, ast.For | ast.comprehension)
        and isinstance(node.target, ast.Name)
        and re.search("summary|result", ast.unparse(node.iter).lower())
    }
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
        named = _NAMES_A_RESULT.search(ast.unparse(base).lower())
        row = isinstance(base, ast.Name) and base.id in rows
        if isinstance(key, ast.Constant) and key.value in SUMMARY_KEYS and (named or row):
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
    code = (
        'a = summary["headline"]\nb = run.result.get("knee")\nc = frame["mode"]\n'
        'd = [r["otb"] for r in result.runs]\ne = result.early["mean_reward"]\n'
        'f = summary["reward"]["share_one"]\n'
    )
    found = sorted(_keyed_reads(ast.parse(code)))
    assert found == [(1, "headline"), (2, "knee"), (4, "otb"), (6, "reward"), (6, "share_one")]


def _holds_any(hint: Any) -> bool:
    """Whether a type hint is `Any` or holds it (`dict[str, Any]`, `list[Any] | None`, ...)."""
    return hint is Any or any(_holds_any(arg) for arg in typing.get_args(hint))


def test_results_are_typed_to_the_leaves() -> None:
    """No field of a result, nor of a record nested in one, is `Any` or holds it: every record
    file reads back into dataclasses and typed containers, never into a bag of keys."""
    loose = [
        f"{record.__name__}.{name}: {hint}"
        for cls in RESULT_CLASSES
        for record in _records(cls)
        for name, hint in typing.get_type_hints(record).items()
        if _holds_any(hint)
    ]
    assert not loose, "\n".join(loose)
    assert _holds_any(dict[str, Any]) and _holds_any(list[int] | dict[str, Any] | None)


def _round_trips(result: Any, tmp_path: Path) -> None:
    """`result` written as its record file reads back equal, and writes the same bytes again."""
    text = json.dumps(result.to_json())
    back = type(result).from_json(json.loads(text), tmp_path / "record.json")
    assert back == result and json.dumps(back.to_json()) == text


@pytest.mark.parametrize("run", ["energy", "variance"])
def test_measured_results_round_trip_in_every_shape(runs: Path, tmp_path: Path, run: str) -> None:
    """energy's and variance-compare's results with the shapes the reduced runs do not make:
    an audit and a skipped one, several rollouts files, no mode with a signal, a full-mode
    record; each round-trips and writes the keys it always wrote."""
    result = read_run(runs / run)
    _round_trips(result, tmp_path)
    files = [FileRecord("/a.jsonl", "0" * 64), FileRecord("/b.jsonl", "1" * 64)]
    several = replace(result.inputs.rollouts, sha256=None, files=files)
    inputs = replace(result.inputs, rollouts=several)
    assert list(schema.plain(several)) == ["path", "format", "files"]
    if isinstance(result, EnergyResult):
        audit = AdvantageAudit("verl", "grpo", {"eps": 1e-6}, 4, 40, 0.0, 0.0, 1e-4, True, None)
        variants = [
            replace(result, inputs=inputs, advantage_audit=audit),
            replace(result, advantage_audit=AuditSkipped("unknown estimator")),
        ]
        assert "advantages   verl logged vs registry 'grpo' (ε=1e-06)" in variants[0].format()
    else:
        assert isinstance(result, VarianceResult)
        none = Recommendation(mode=None, claim=None, text="no knee")
        full = FullMode("jvp", "JL", "JL", {"engine": "jvp", "budget_s": None}, [], {})
        variants = [replace(result, inputs=inputs, noise_scale=none, full={"1200": full})]
        assert list(schema.plain(none)) == ["mode", "claim", "text"]
        assert variants[0].recommendation_where == "no signal"
    for variant in variants:
        _round_trips(variant, tmp_path)


def test_the_other_results_round_trip(tmp_path: Path) -> None:
    """train.json, collapse.json (its rule with its description, a pooled budget, arms),
    manifest.json, report's and figures' records: each reads back equal, byte for byte."""
    budget = PooledBudget("otb", 40, "B ~ 12 prompts", {"noise_scale": 12.0, "snr": None}, {})
    arm = DynamicsArm("a", "otb", 4, ["a"], [None], 0, [1e5], 1, 1e5, None, None, 0.5, None, None)
    dynamics = DynamicsResult(
        rule=DetectionRule(window=20),
        target=0.5,
        runs=[replace(_run("r", {"otb/x": 1.0}), budget=[budget])],
        outputs="/o",
        arms=[arm],
    )
    written = dynamics.to_json()
    assert written["rule"] == {**dataclasses.asdict(DetectionRule(window=20)),
                               "description": DetectionRule(window=20).describe()}  # fmt: skip
    assert "7 figures" in dynamics.format()  # every dynamics figure: live, budget and arms (2)
    train = TrainResult(
        checkpoint="/c",
        settings=TrainSettings(lr=3e-4),
        window=2,
        early={"mean_reward": 0.1},
        late={"mean_reward": 0.2},
        totals=TrainTotals(steps=4, tokens_sampled=100, wall_time=1.0),
        versions={"torch": "2"},
        out="/o",
    )
    report = ReportResult("/r.html", [ReportedRun("energy", "e", "/e")], [Verdict("t", "s.")], [])
    for result in (dynamics, train, SAMPLED, report):
        _round_trips(result, tmp_path)
    record = json.loads((ROOT / "figures" / "figures.json").read_text(encoding="utf-8"))
    figures = build(FiguresResult, record)
    assert isinstance(figures.noise_scale, Recommendation)
    swept = replace(figures, sweep=Sweep(1e-3, "r", [SweepRun(1e-3, 12, 0.5, 0.1, True, True)]))
    assert build(FiguresResult, json.loads(json.dumps(swept.to_json()))) == swept
