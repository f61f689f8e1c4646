"""`VarianceSettings`' checks: the API refuses what the CLI refuses, with the same error, before
anything is read or written (every command's knobs: tests/cli/test_bad_values.py)."""

from pathlib import Path

import pytest
from otb_diag.cli.main import app
from typer.testing import CliRunner

from otb_diag import api
from otb_diag.errors import InputError
from otb_diag.pipelines.variance.recipe import VarianceSettings


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        (
            {"modes": ("proxy", "nope")},
            r"--mode: must be one of proxy, head, full, got 'nope' \(in proxy,nope\)",
        ),
        ({"modes": ()}, "--mode: names nothing"),
        ({"engine": "fwd"}, "--engine: must be one of auto, jvp, vjp, got 'fwd'"),
        ({"budget_s": 0.0}, "--budget: must be above 0, got 0.0"),
    ],
)
def test_api_refuses_bad_settings_before_reading(
    tmp_path: Path, settings: dict, message: str
) -> None:
    missing = tmp_path / "no-such-rollouts.jsonl"  # never read: the check comes first
    with pytest.raises(InputError, match=message):
        api.variance_compare(tmp_path / "no-such-ckpt", missing, tmp_path / "out", **settings)
    assert not (tmp_path / "out").exists()


def test_good_settings_pass() -> None:
    VarianceSettings().check()
    VarianceSettings(modes=("full",), engine="vjp", budget_s=None).check()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--mode", "nope"], "--mode: must be one of proxy, head, full, got 'nope'"),
        (["--engine", "fwd"], "--engine: must be one of auto, jvp, vjp, got 'fwd'"),
        (["--budget", "0s"], "--budget: must be above 0, got 0.0"),
    ],
)
def test_cli_gives_the_library_error(tmp_path: Path, args: list[str], message: str) -> None:
    result = CliRunner().invoke(app, ["variance-compare", *args, "--out", str(tmp_path / "o")])
    assert result.exit_code == 2
    assert message in result.stderr and "Traceback" not in result.stderr
    assert not (tmp_path / "o").exists()
