"""`otb_diag/runtime/library_logs.py`: a library logger that writes to stdout (DeepSpeed's, set
up as deepspeed/utils/logging.py sets it up) writes to stderr once the command line ran, so that
`--json` output stays JSON; and, for real, the first `import deepspeed` of a command (its
accelerator's warning) leaves stdout empty."""

from __future__ import annotations

import logging
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from otb_diag.runtime.library_logs import STDOUT_LOGGERS, ToStderr, logs_to_stderr


def stdout_logger(name: str) -> logging.Logger:
    """A logger as DeepSpeed's factory makes it: its own stdout handler, not propagating."""
    logger = logging.getLogger(name)
    logger.setLevel(logging.INFO)
    logger.propagate = False
    handler = logging.StreamHandler(stream=sys.stdout)
    logger.addHandler(handler)
    return logger


def test_a_library_logger_on_stdout_writes_to_stderr(capsys: pytest.CaptureFixture) -> None:
    name = STDOUT_LOGGERS[0]
    logger = logging.getLogger(name)
    before = (list(logger.handlers), list(logger.filters), logger.level, logger.propagate)
    try:
        logs_to_stderr()
        logs_to_stderr()  # once per logger
        assert sum(isinstance(f, ToStderr) for f in logger.filters) == 1
        stdout_logger(name).warning("Setting accelerator to CPU.")
        out, err = capsys.readouterr()
        assert out == "" and err == f"[{name} WARNING] Setting accelerator to CPU.\n"
    finally:
        logger.handlers, logger.filters, logger.level, logger.propagate = before


@pytest.mark.external  # imports DeepSpeed (the [sharded] extra)
def test_importing_deepspeed_under_the_command_line_leaves_stdout_to_the_command() -> None:
    """In a fresh process, as `otb-diag train --json` met it: accelerate imports deepspeed, whose
    accelerator detection warns on its logger; after any command's start nothing of it is on
    stdout."""
    pytest.importorskip("deepspeed", reason="the [sharded] extra: make setup-sharded")
    code = (
        "from typer.testing import CliRunner\n"
        "from otb_diag.cli.main import app\n"
        "assert CliRunner().invoke(app, ['report', '--help']).exit_code == 0\n"
        "import deepspeed.accelerator as a\n"
        "a.get_accelerator()\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout == "", done.stdout
    assert "[DeepSpeed" in done.stderr


def test_the_root_callback_installs_it() -> None:
    from otb_diag.cli.main import app

    logger = logging.getLogger(STDOUT_LOGGERS[0])
    filters = list(logger.filters)
    try:
        logger.filters = [f for f in filters if not isinstance(f, ToStderr)]
        assert CliRunner().invoke(app, ["report", "--help"]).exit_code == 0
        assert any(isinstance(f, ToStderr) for f in logger.filters)
    finally:
        logger.filters = filters
