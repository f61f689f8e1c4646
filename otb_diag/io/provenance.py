"""Where numbers came from: content hashes of inputs (of a checkpoint, a fingerprint that reads a
few MiB unless the full hash is asked for) and the versions of the libraries that made them, so a
summary.json can be compared with another run's."""

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
    single file (a `.gguf` checkpoint) is hashed as the one file it is. Reads every byte: minutes
    for a 70 B checkpoint (`checkpoint_fingerprint` reads a few MiB)."""
    root = Path(path)
    if root.is_file():
        return file_sha256(root)
    digest = hashlib.sha256()
    for file in _files(root):
        digest.update(str(file.relative_to(root)).encode())
        digest.update(file_sha256(file).encode())
    return digest.hexdigest()


# The fingerprint reads files up to this size whole (configs, index, tokenizer), and of a larger
# file its safetensors header and `SAMPLES` blocks of `SAMPLE_BYTES` spread evenly over it.
WHOLE_FILE_BYTES = 1 << 20
SAMPLES = 16
SAMPLE_BYTES = 1 << 16
FINGERPRINTED = (
    f"every file's name and size; the content of files up to {WHOLE_FILE_BYTES >> 20} MiB "
    f"(config, index, tokenizer); of a larger file its safetensors header and {SAMPLES} blocks "
    f"of {SAMPLE_BYTES >> 10} KiB spread evenly over it"
)


def checkpoint_fingerprint(path: str | Path, *, full: bool = False) -> dict[str, str]:
    """`{"sha256": …, "hashed": …}` of a checkpoint (a directory, or one `.gguf` file), saying
    what was hashed: everything (`full`, `directory_sha256`) or `FINGERPRINTED`, which reads
    a few MiB whatever the checkpoint's size. A training step changes every weight, so two
    checkpoints of one run differ in every sampled block; the same file sizes and headers alone
    would not tell them apart."""
    root = Path(path)
    if full:
        return {"sha256": directory_sha256(root), "hashed": "every byte of every file"}
    files = [root] if root.is_file() else _files(root)
    digest = hashlib.sha256()
    for file in files:
        digest.update(f"{file.relative_to(root) if file != root else file.name}\0".encode())
        digest.update(_file_fingerprint(file))
    return {"sha256": digest.hexdigest(), "hashed": FINGERPRINTED}


def _file_fingerprint(path: Path) -> bytes:
    """The bytes that stand for one file in `checkpoint_fingerprint`: its size, then its content
    (small files) or its safetensors header and evenly spread samples (large ones)."""
    size = path.stat().st_size
    parts = [size.to_bytes(8, "little")]
    with open(path, "rb") as f:
        if size <= WHOLE_FILE_BYTES:
            parts.append(f.read())
            return b"".join(parts)
        if path.suffix == ".safetensors":
            head = f.read(8)  # u64 little-endian length of the JSON header that follows
            parts += [head, f.read(min(int.from_bytes(head, "little"), size - 8))]
        stride = (size - SAMPLE_BYTES) // (SAMPLES - 1)
        for i in range(SAMPLES):  # offsets 0, stride, …, size − SAMPLE_BYTES
            f.seek(i * stride)
            parts.append(f.read(SAMPLE_BYTES))
    return b"".join(parts)


def _files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file())


def library_versions() -> dict[str, str]:
    versions = {"python": platform.python_version()}
    for name in LIBRARIES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = "not installed"
    return versions
