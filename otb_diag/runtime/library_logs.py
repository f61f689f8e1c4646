"""Libraries' log lines on stderr, where the command line's own notes go, so that stdout holds
only a command's output (`--json` above all).

DeepSpeed's logger writes to stdout (`deepspeed/utils/logging.py`: a `StreamHandler` on
`sys.stdout`), and accelerate imports deepspeed wherever it is installed (the `[sharded]` extra)
as transformers saves a model: `otb-diag train --json` printed "[WARNING] [real_accelerator.py]
Setting accelerator to CPU ..." before its JSON. A filter on such a logger writes each record to
stderr instead and drops it from the logger's own handlers; the record is still logged, at the
logger's level, and the Python API (`attach` inside a user's training) is left alone."""

from __future__ import annotations

import logging
import sys

# The loggers of libraries that write to stdout (installed before the library creates them:
# its own set-up adds its handler and keeps the filters it finds).
STDOUT_LOGGERS = ("DeepSpeed",)
FORMAT = logging.Formatter("[%(name)s %(levelname)s] %(message)s")


class ToStderr(logging.Filter):
    """Writes a record to the current `sys.stderr` and keeps it from the logger's handlers."""

    def filter(self, record: logging.LogRecord) -> bool:
        sys.stderr.write(FORMAT.format(record) + "\n")
        return False


def logs_to_stderr() -> None:
    """Every logger of `STDOUT_LOGGERS` writes to stderr (once per logger)."""
    for name in STDOUT_LOGGERS:
        logger = logging.getLogger(name)
        if not any(isinstance(f, ToStderr) for f in logger.filters):
            logger.addFilter(ToStderr())
