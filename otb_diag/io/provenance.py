"""Where numbers came from: content hashes of inputs and the versions of the libraries that made
them, so a summary.json can be compared with another run's."""

from __future__ import annotations

import hashlib
import platform
from importlib import metadata
from pathlib import Path

LIBRARIES = ("otb-diag", "torch", "transformers", "tokenizers", "numpy", "pandas", "scipy")


def file_sha256(path: str | Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def directory_sha256(path: str | Path) -> str:
    """Hash of every file's relative name and content below `path` (sorted, so order-free); a
    single file (a `.gguf` checkpoint) is hashed as the one file it is."""
    root = Path(path)
    if root.is_file():
        return file_sha256(root)
    digest = hashlib.sha256()
    for file in sorted(p for p in root.rglob("*") if p.is_file()):
        digest.update(str(file.relative_to(root)).encode())
        digest.update(file_sha256(file).encode())
    return digest.hexdigest()


def library_versions() -> dict[str, str]:
    versions = {"python": platform.python_version()}
    for name in LIBRARIES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = "not installed"
    return versions
