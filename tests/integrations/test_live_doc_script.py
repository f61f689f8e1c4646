"""The runnable script that opens docs/live.md ("A run to start from") and the `dynamics`
command after it run as written, in a fresh folder: the run logs at most 20 `otb/` keys a
step and `dynamics` pools its split."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest
from otb_diag.cli.main import app
from typer.testing import CliRunner
from unwritten_figures import unwritten_figures

pytestmark = pytest.mark.external  # runs TRL
DOC = Path(__file__).resolve().parents[2] / "docs" / "live.md"


def blocks(language: str) -> list[str]:
    """The fenced `language` blocks of the doc's "A run to start from" section."""
    section = DOC.read_text().split("## A run to start from", 1)[1].split("\n## ", 1)[0]
    return re.findall(rf"```{language}\n(.*?)```", section, flags=re.DOTALL)


def test_the_docs_first_run_and_its_dynamics_run_as_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    (script,) = blocks("python")
    exec(compile(script, str(DOC), "exec"), {"__name__": "docs_live"})  # noqa: S102
    state = json.loads(Path("out/grpo-live/trainer_state.json").read_text())
    steps = [e for e in state["log_history"] if "grad_norm" in e]
    assert len(steps) == 20
    assert all(0 < sum(k.startswith("otb/") for k in e) <= 20 for e in steps)
    (command,) = blocks("bash")
    args = shlex.split(command.strip())
    assert args[:2] == ["otb-diag", "dynamics"]
    with unwritten_figures():
        result = CliRunner().invoke(app, args[1:])
    assert result.exit_code == 0, result.output
    assert "you train with 2 prompts a step" in result.output  # the pooled answer's sentence
