"""`--json` prints the command's summary as JSON on stdout instead of the text, on every
command that prints one (energy, regress, dynamics, rollouts inspect, train and figures are
tested beside their pipelines)."""

import json
from pathlib import Path

import pytest
from otb_diag.cli.main import app
from typer.testing import CliRunner

from otb_diag.io.scenarios import default_checkpoint
from otb_diag.pipelines.report.html import text as escaped

runner = CliRunner()


@pytest.mark.slow  # runs a command end to end (a real run: seconds)
def test_variance_compare_json_is_the_summary(reduced_rollouts: Path, tmp_path: Path) -> None:
    args = ["variance-compare", "--ckpt", str(default_checkpoint()), "--rollouts"]
    args += [str(reduced_rollouts), "--mode", "proxy", "--group-sizes", "2", "--draws", "10"]
    args += ["--bootstrap", "20", "--baselines", "none,mean,otb", "--quiet"]
    text = runner.invoke(app, [*args, "--out", str(tmp_path / "t")])
    as_json = runner.invoke(app, [*args, "--out", str(tmp_path / "j"), "--json"])
    assert text.exit_code == as_json.exit_code == 0, as_json.output
    printed = json.loads(as_json.stdout)
    assert printed == json.loads((tmp_path / "j" / "summary.json").read_text())
    with pytest.raises(json.JSONDecodeError):
        json.loads(text.stdout)


def test_report_json_names_runs_and_verdicts(runs: Path, tmp_path: Path) -> None:
    out = tmp_path / "r.html"
    result = runner.invoke(app, ["report", str(runs), "--out", str(out), "--json"])
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert summary["out"] == str(out.resolve()) and out.exists()
    assert sorted(r["command"] for r in summary["runs"]) == ["energy", "variance-compare"]
    page = out.read_text()
    assert summary["verdicts"] and all(escaped(v["topic"]) in page for v in summary["verdicts"])
    assert any("dynamics" in a for a in summary["absent"])
    text = runner.invoke(app, ["report", str(runs), "--out", str(out)])
    assert text.stdout.strip() == f"wrote {out.resolve()}"


MANIFEST = {
    "seed": 0,
    "n_params": 12345,
    "checkpoints": [{"step": 100, "dir": "checkpoints/checkpoint-100"}],
    "rollouts": {
        "rows": 64,
        "groups": 4,
        "mixed_groups": 3,
        "mean_reward": 0.5,
        "response_tokens": {"min": 2, "median": 9.0, "max": 41},
    },
    "timings": {"total_s": 3.0},
}


@pytest.fixture
def fake_build(monkeypatch: pytest.MonkeyPatch) -> list[dict]:
    """`build_lab` replaced by one that records its call and returns MANIFEST."""
    calls: list[dict] = []

    def build_lab(out: Path, **kwargs: object) -> dict:
        calls.append({"out": out, **kwargs})
        return MANIFEST

    monkeypatch.setattr("otb_diag.pipelines.lab_build.build_lab", build_lab)
    return calls


def test_lab_build_json_is_the_manifest_and_text_summarises_it(
    fake_build: list[dict], tmp_path: Path
) -> None:
    as_json = runner.invoke(app, ["lab", "build", "--out", str(tmp_path), "--quiet", "--json"])
    assert as_json.exit_code == 0, as_json.output
    assert json.loads(as_json.stdout) == MANIFEST
    text = runner.invoke(app, ["lab", "build", "--out", str(tmp_path), "--seed", "3"])
    assert text.exit_code == 0, text.output
    assert "12,345-parameter lab" in text.stdout and "steps 100" in text.stdout
    assert "64 rows in 4 groups (3 with mixed rewards)" in text.stdout
    assert [c["seed"] for c in fake_build] == [0, 3]


def test_dynamics_label_count_mismatch_exits_2(tmp_path: Path) -> None:
    """The library's InputError (tests/pipelines/test_dynamics.py) is exit 2 on the CLI."""
    logs = [tmp_path / "a.jsonl", tmp_path / "b.jsonl"]
    args = ["dynamics", "--log", str(logs[0]), "--log", str(logs[1]), "--label", "x"]
    result = runner.invoke(app, [*args, "--out", str(tmp_path / "o")])
    assert result.exit_code == 2 and "1 --label for 2 --log" in result.stderr
