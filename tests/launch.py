"""Launching otb-diag or a script on several gloo processes with torchrun (CPU), for the
tests that check what several processes do: tests/runtime/test_torchrun.py (the commands),
tests/integrations/test_trl_processes.py (TRL's trainers with `attach`),
tests/integrations/test_ddp_noise.py (the all-parameter estimate under DDP) and
tests/integrations/test_live_sharded.py (the live core under FSDP2), and
tests/integrations/test_trl_sharded.py (TRL under DeepSpeed ZeRO-3, beside DDP). Every script
it launches joins and leaves the group through `otb_diag.runtime.torchrun.session`, as otb-diag
does: a rank that tears gloo down on its own can abort after its work is done. A launch that
several test modules read runs once a session (`launched_once`)."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from subprocess import PIPE

import psutil  # [dev] (and accelerate's dependency)
import pytest
from conftest import built_once

import otb_diag

BIN = Path(sys.executable).parent / "otb-diag"
ROOT = Path(otb_diag.__file__).resolve().parents[1]  # the repository the tests import


def torchrun(
    n: int, *args: str | Path, timeout: float = 240, script: Path | None = None
) -> subprocess.CompletedProcess:
    """`otb-diag ARGS` (or `python SCRIPT ARGS`) on `n` gloo ranks."""
    with socket.socket() as s:  # a free port for the rendezvous
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(n)]
    cmd += ["--master-addr", "127.0.0.1", "--master-port", str(port)]
    # "--" ends torchrun's options: its parser would take `rollouts sample --n` as an
    # ambiguous abbreviation of its own --nnodes/--nproc-per-node.
    cmd += ["--", str(script)] if script else ["--no-python", "--", str(BIN)]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "OTB_DIAG_DIST_TIMEOUT_S": "120"}
    # The launched processes import the otb_diag this one imports: a git worktree's, not the
    # folder the editable install points at (its finder comes after PYTHONPATH's entries).
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    # A rank killed by a signal (SIGABRT inside gloo, say) prints every thread's Python stack,
    # so a failure in CI says where that rank was.
    env["PYTHONFAULTHANDLER"] = "1"
    with subprocess.Popen(
        cmd + [str(a) for a in args], stdout=PIPE, stderr=PIPE, text=True, env=env
    ) as launch:
        try:
            stdout, stderr = launch.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            # The ranks too: torchrun starts each in a session of its own, so killing torchrun
            # alone leaves a hung rank running to the process group's timeout, holding the
            # output pipes open (the test would wait for it all the same).
            ranks = psutil.Process(launch.pid).children(recursive=True)
            launch.kill()
            for rank in ranks:
                with contextlib.suppress(psutil.NoSuchProcess):
                    rank.kill()
            stdout, stderr = launch.communicate()
            raise subprocess.TimeoutExpired(launch.args, timeout, stdout, stderr) from None
    return subprocess.CompletedProcess(launch.args, launch.returncode, stdout, stderr)


def launched_once(
    factory: pytest.TempPathFactory, name: str, n: int, *args: str | Path, script: Path
) -> tuple[Path, subprocess.CompletedProcess]:
    """`torchrun(n, folder, *args, script=script)` once per pytest session, also across the
    xdist workers (`conftest.built_once`, folder `name`), for the test modules that read the
    same launch: its folder, and its return code and output as the launch left them."""

    def launch(folder: Path) -> None:
        result = torchrun(n, folder, *args, script=script)
        kept = {"args": result.args, "returncode": result.returncode}
        kept |= {"stdout": result.stdout, "stderr": result.stderr}
        (folder / "launch.json").write_text(json.dumps(kept))

    folder = built_once(factory, name, launch)
    kept = json.loads((folder / "launch.json").read_text())
    return folder, subprocess.CompletedProcess(**kept)
