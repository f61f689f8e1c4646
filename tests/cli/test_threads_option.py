"""The commands that run a model take --threads and enter their entry point already on the
chosen count (`otb_diag/runtime/threads.py`), restored after; auto says its choice on stderr;
the console script makes libgomp's waits passive before torch loads."""

from __future__ import annotations

import os
from typing import Any

import pytest
import torch
from otb_diag.cli import main as cli_main
from otb_diag.cli.main import app
from test_entry_points import entry_point
from test_knobs import COMMANDS
from typer.testing import CliRunner

THREADED = {"energy", "variance-compare", "train", "figures", "rollouts sample"}
REQUIRED = {"rollouts sample": ["--prompts", "p.jsonl", "--out", "o"]}


def test_model_commands_enter_on_their_threads(monkeypatch: pytest.MonkeyPatch) -> None:
    offered = {name for name, cmd in COMMANDS if any(o.name == "threads" for o in cmd.options())}
    assert offered == THREADED
    for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        monkeypatch.delenv(name, raising=False)
    before, seen, set_to = torch.get_num_threads(), [], []
    real_set = torch.set_num_threads
    monkeypatch.setattr(torch, "set_num_threads", lambda n: (set_to.append(n), real_set(n)))
    for name in sorted(THREADED):
        entry = entry_point(name)

        def stand_in(*args: Any, **kwargs: Any) -> None:
            seen.append(torch.get_num_threads())  # what the entry point's work would run on

        monkeypatch.setattr(entry.__module__ + "." + entry.__name__, stand_in)
        words = [*name.split(), *REQUIRED.get(name, [])]
        for extra, threads in (["--threads", "3"], 3), ([], 1):  # auto: the toy is small
            set_to.clear()
            result = CliRunner().invoke(app, [*words, *extra])
            assert result.exit_code == 0, (name, result.output)
            assert seen.pop() == threads and set_to == [threads, before], name
            assert ("--threads auto: 1 torch thread" in result.stderr) is not extra, name
        assert torch.get_num_threads() == before
    bad = CliRunner().invoke(app, ["train", "--threads", "0"])
    said = "--threads: must be a whole number from 1 up, or auto, got '0'"
    assert bad.exit_code == 2 and said in bad.stderr, bad.stderr


def test_the_console_script_calms_the_waits_first(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    monkeypatch.delenv("GOMP_SPINCOUNT", raising=False)
    policy: list[str | None] = []
    monkeypatch.setattr(cli_main, "app", lambda: policy.append(os.environ.get("OMP_WAIT_POLICY")))
    cli_main.main()
    assert policy == ["PASSIVE"]
