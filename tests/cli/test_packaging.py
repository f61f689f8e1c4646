"""What `pip install otb-diag` puts into a user's environment: the CLI inside the package (no
top-level `cli` to collide with another distribution's), the console script, `python -m
otb_diag`, and the shipped toy lab. Built as a wheel and installed into a fresh venv."""

from __future__ import annotations

import subprocess
import sys
import sysconfig
import venv
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh venv holding only the otb-diag wheel; its dependencies (torch, transformers, …)
    come from this interpreter's site-packages through a .pth line, which adds that folder to
    the path without running its .pth files, so the editable install of this checkout stays
    out of sight."""
    tmp = tmp_path_factory.mktemp("wheel")
    try:
        subprocess.run(
            [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
             "-q", "-w", str(tmp / "dist"), str(ROOT)],
            check=True, capture_output=True, text=True,
        )  # fmt: skip
    except subprocess.CalledProcessError as err:
        pytest.fail(f"building the wheel failed:\n{err.stderr[-3000:]}")
    env_dir = tmp / "venv"
    venv.create(env_dir, with_pip=False)
    python = env_dir / "bin" / "python"
    site = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True, capture_output=True, text=True,
    ).stdout.strip()  # fmt: skip
    (Path(site) / "deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    wheel = next((tmp / "dist").glob("otb_diag-*.whl"))
    subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps",
         "--no-index", "-q", str(wheel)],
        check=True, capture_output=True, text=True,
    )  # fmt: skip
    return env_dir


def run(env_dir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    # Run from an empty folder: the checkout itself must not be importable.
    cwd = env_dir.parent / "elsewhere"
    cwd.mkdir(exist_ok=True)
    return subprocess.run(args, cwd=cwd, capture_output=True, text=True, timeout=300)


@pytest.mark.external  # builds the wheel and pip-installs it (`installed`)
def test_no_top_level_cli_package(installed: Path) -> None:
    python = str(installed / "bin" / "python")
    probe = run(installed, python, "-c", "import otb_diag.cli.main as m; print(m.__file__)")
    assert probe.returncode == 0, probe.stderr
    assert str(installed) in probe.stdout  # the installed copy, not this checkout
    clash = run(installed, python, "-c", "import cli")
    assert clash.returncode != 0 and "No module named 'cli'" in clash.stderr


@pytest.mark.external  # builds the wheel and pip-installs it (`installed`)
def test_console_script_and_module_run_the_same_app(installed: Path) -> None:
    script = run(installed, str(installed / "bin" / "otb-diag"), "--help")
    module = run(installed, str(installed / "bin" / "python"), "-m", "otb_diag", "--help")
    assert script.returncode == 0 and module.returncode == 0, script.stderr + module.stderr
    for out in (script.stdout, module.stdout):
        assert "variance-compare" in out and "energy" in out
    assert script.stdout.split("\n", 1)[1] == module.stdout.split("\n", 1)[1]  # past "Usage:"


@pytest.mark.external  # builds the wheel and pip-installs it (`installed`)
def test_the_embedded_scenarios_ship_in_the_wheel(installed: Path) -> None:
    code = (  # one interpreter for both scenarios: its start-up is most of the cost
        "import otb_diag as od\n"
        "for s in ('default', 'long'):\n"
        "    c, r = od.embedded_default(s)\n"
        "    print(r.is_file(), (c / 'config.json').is_file(), (c / 'model.safetensors').is_file())"
    )
    probe = run(installed, str(installed / "bin" / "python"), "-c", code)
    assert probe.returncode == 0, probe.stderr
    assert probe.stdout.split() == ["True"] * 6


def test_every_package_is_listed_for_the_wheel() -> None:
    """pyproject's explicit `packages` names every folder of otb_diag/ with an __init__.py (a new
    sub-package left out imports in the editable install and fails in a wheel), and the
    embedded scenarios' data folders, which Python also sees as packages (setuptools warns of
    each one left out)."""
    import tomllib

    root = Path(__file__).resolve().parents[2]
    listed = set(
        tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]
    )
    found = {
        ".".join(p.parent.relative_to(root).parts) for p in (root / "otb_diag").rglob("__init__.py")
    }
    data = {f"otb_diag.lab.{s}{sub}" for s in ("default", "long") for sub in ("", ".checkpoints")}
    assert all((root / p.replace(".", "/")).is_dir() for p in data)
    assert found | {"otb_diag.cli"} | data == listed
