"""Write files so that a crash or a bad input never leaves a half-written output behind:
everything goes to a temporary file in the destination's directory, then `os.replace`."""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import shutil
import socket
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any


@contextlib.contextmanager
def atomic_path(dest: str | Path) -> Iterator[Path]:
    """Yield a temporary path beside `dest`; on success it is renamed onto `dest`, else removed."""
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{dest.name}.", suffix=".tmp", dir=dest.parent)
    os.close(fd)
    tmp_path = Path(tmp)
    try:
        yield tmp_path
        # mkstemp makes the file private (0600); give it the mode a plain open() would have.
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp_path, 0o666 & ~umask)
        os.replace(tmp_path, dest)
    finally:
        tmp_path.unlink(missing_ok=True)


def write_text(dest: str | Path, text: str) -> None:
    with atomic_path(dest) as tmp:
        tmp.write_text(text, encoding="utf-8")


def json_text(data: Any) -> str:
    """Strict JSON (other tools reject NaN and Infinity): non-finite numbers become null."""

    def clean(x: Any) -> Any:
        if isinstance(x, float) and not math.isfinite(x):
            return None
        if isinstance(x, dict):
            return {k: clean(v) for k, v in x.items()}
        if isinstance(x, (list, tuple)):
            return [clean(v) for v in x]
        return x

    return json.dumps(clean(data), indent=2, allow_nan=False)


def write_json(dest: str | Path, data: Any) -> None:
    write_text(dest, json_text(data) + "\n")


def write_jsonl(dest: str | Path, rows: list[dict[str, Any]]) -> None:
    lines = (json.dumps(row, separators=(",", ":"), allow_nan=False) for row in rows)
    write_text(dest, "".join(line + "\n" for line in lines))


def write_with(dest: str | Path, writer: Callable[[Path], None]) -> None:
    """Atomic version of any `writer(path)`, e.g. `lambda p: frame.to_parquet(p)`."""
    with atomic_path(dest) as tmp:
        writer(tmp)


STAGING_PREFIX = ".otb-diag-staging-"


@contextlib.contextmanager
def staged_output(out: str | Path) -> Iterator[Path]:
    """A hidden staging directory inside `out` for all of a run's files: on success each moves
    into `out` (`os.replace`, a rename each; a folder replaces the one of that name whole) and
    the staging directory goes; on any failure or interruption (Ctrl-C, SIGTERM from torchrun
    when another rank died) it goes with everything in it, and `out` too if this run created it
    and nothing else is in it. So `out` holds either every output of the run or none, never
    some of them.

    A run killed outright (SIGKILL, the machine going down) cleans nothing: its staging
    directory, named after the machine and the process, is removed by the next run into `out`
    once that process is gone (`_remove_stale_staging`)."""
    out = Path(out)
    existed = out.exists()
    out.mkdir(parents=True, exist_ok=True)
    _remove_stale_staging(out)
    stage = Path(tempfile.mkdtemp(prefix=f"{STAGING_PREFIX}{_host()}-{os.getpid()}-", dir=out))
    try:
        yield stage
        for item in sorted(stage.iterdir()):
            target = out / item.name
            if item.is_dir() and target.is_dir() and not target.is_symlink():
                shutil.rmtree(target)  # a folder the run writes replaces the last run's whole
            os.replace(item, target)
    finally:
        shutil.rmtree(stage, ignore_errors=True)
        if not existed and not any(out.iterdir()):
            out.rmdir()


def _remove_stale_staging(out: Path) -> list[Path]:
    """Remove the staging directories in `out` whose run, on this machine, no longer exists;
    those of a live process (another run into `out`), of another machine (a shared file
    system) or not named by `staged_output` are left alone. Returns the removed ones."""
    removed = []
    for folder in sorted(out.glob(f"{STAGING_PREFIX}*")):
        host, _, rest = folder.name.removeprefix(STAGING_PREFIX).partition("-")
        pid = rest.partition("-")[0]
        if host == _host() and pid.isdigit() and not _alive(int(pid)):
            shutil.rmtree(folder, ignore_errors=True)
            removed.append(folder)
    return removed


def _host() -> str:
    """This machine's name, with no `-` (the separator of the staging directory's name)."""
    return re.sub(r"[^A-Za-z0-9.]", "_", socket.gethostname()) or "host"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)  # signal 0: only asks whether the process exists
    except ProcessLookupError:
        return False
    except PermissionError:  # it exists, under another user
        return True
    return True
