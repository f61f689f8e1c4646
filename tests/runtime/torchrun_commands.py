"""Several otb-diag commands in one torchrun launch, for tests/runtime/test_torchrun.py: each
rank pays the start-up (torch, transformers) once, not once a command.

    torchrun --nproc-per-node 2 -- torchrun_commands.py OUT COMMANDS_JSON

COMMANDS_JSON maps a name to the command's arguments. Inside one `session()` (the commands'
own `session()` joins the group it opened, runtime/torchrun.py:session), each rank runs every
command in turn as `otb-diag ARGS` would, its figures drawn, not rendered (the test compares
the outputs' names; tests/unwritten_figures.py), its stdout into `OUT/NAME.rank{r}.out` and its
stderr into `OUT/NAME.rank{r}.err`, and writes `OUT/rank{r}.json`: every command's exit status
and, after the session is left, the names of the process's threads (gloo's must be gone with the
group). A command may fail (bad input, exit 2): the ranks stop it together and go on to the
next."""

from __future__ import annotations

import contextlib
import json
import os
import sys
from pathlib import Path

from otb_diag.cli.main import app

from otb_diag.runtime.torchrun import session

sys.path.insert(0, str(Path(__file__).parents[1]))  # tests/, as pytest's `pythonpath`
from unwritten_figures import unwritten_figures  # noqa: E402


def run(args: list[str]) -> int:
    """`otb-diag ARGS` in this process: its exit status."""
    try:
        app(args, prog_name="otb-diag")
    except SystemExit as done:
        return int(done.code or 0)
    return 0


def main(out: Path, commands: dict[str, list[str]]) -> None:
    codes = {}
    with session() as d, unwritten_figures():
        for name, args in commands.items():
            stdout, stderr = (out / f"{name}.rank{d.rank}.{s}" for s in ("out", "err"))
            with (
                stdout.open("w") as o,
                stderr.open("w") as e,
                contextlib.redirect_stdout(o),
                contextlib.redirect_stderr(e),
            ):
                codes[name] = run(args)
    tasks = Path("/proc/self/task")  # Linux only: the test reading them skips elsewhere
    ids = os.listdir(tasks) if tasks.is_dir() else []
    threads = [(tasks / t / "comm").read_text().strip() for t in ids]
    record = {"codes": codes, "threads": threads}
    (out / f"rank{d.rank}.json").write_text(json.dumps(record))


if __name__ == "__main__":
    main(Path(sys.argv[1]), json.loads(Path(sys.argv[2]).read_text()))
