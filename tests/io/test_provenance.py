"""The checkpoint fingerprint: what it reads, what it tells apart, and the full hash on request."""

from __future__ import annotations

import hashlib
import json
import struct
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from otb_diag.io import provenance
from otb_diag.io.provenance import (
    FINGERPRINTED,
    checkpoint_fingerprint,
    directory_sha256,
    file_sha256,
)

ROWS = 600  # a 600 × 1024 fp32 tensor: 2.4 MiB, above WHOLE_FILE_BYTES


def checkpoint(path: Path, seed: int, step: int = 1) -> Path:
    """A checkpoint directory: config, index and a safetensors file of random weights."""
    path.mkdir(parents=True)
    gen = torch.Generator().manual_seed(seed)
    save_file({"w": torch.randn(ROWS, 1024, generator=gen)}, path / "model.safetensors")
    (path / "config.json").write_text(json.dumps({"step": step}))
    index = {"weight_map": {"w": "model.safetensors"}}
    (path / "model.safetensors.index.json").write_text(json.dumps(index))
    return path


def test_full_hash_is_every_byte(tmp_path: Path) -> None:
    ckpt = checkpoint(tmp_path / "a", 0)
    digest = hashlib.sha256()
    for name in ("config.json", "model.safetensors", "model.safetensors.index.json"):
        digest.update(name.encode())
        digest.update(file_sha256(ckpt / name).encode())  # independent recomputation
    assert checkpoint_fingerprint(ckpt, full=True) == {
        "sha256": digest.hexdigest(), "hashed": "every byte of every file",
    }  # fmt: skip
    assert directory_sha256(ckpt) == digest.hexdigest()


def test_fingerprint_reads_a_few_blocks_and_says_so(tmp_path: Path, monkeypatch) -> None:
    ckpt = checkpoint(tmp_path / "a", 0)
    read: list[int] = []
    real_open = open

    class Counting:
        def __init__(self, f):
            self.f = f

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.f.close()

        def seek(self, offset):
            return self.f.seek(offset)

        def read(self, n=-1):
            data = self.f.read(n)
            read.append(len(data))
            return data

    monkeypatch.setattr(provenance, "open", lambda p, mode: Counting(real_open(p, mode)),
                        raising=False)  # fmt: skip
    fp = checkpoint_fingerprint(ckpt)
    size = (ckpt / "model.safetensors").stat().st_size
    header = struct.unpack("<Q", (ckpt / "model.safetensors").read_bytes()[:8])[0]
    small = sum((ckpt / n).stat().st_size for n in ("config.json", "model.safetensors.index.json"))
    expected = small + 8 + header + provenance.SAMPLES * provenance.SAMPLE_BYTES
    assert sum(read) == expected < size / 2
    assert fp["hashed"] == FINGERPRINTED and len(fp["sha256"]) == 64


def test_fingerprint_tells_checkpoints_apart(tmp_path: Path) -> None:
    a = checkpoint_fingerprint(checkpoint(tmp_path / "a", 0))
    assert checkpoint_fingerprint(checkpoint(tmp_path / "same", 0)) == a  # order-free, path-free
    assert checkpoint_fingerprint(checkpoint(tmp_path / "b", 1)) != a  # other weights, same shapes
    assert checkpoint_fingerprint(checkpoint(tmp_path / "c", 0, step=2)) != a  # other config
    # one weight changed in the middle of the file: caught when it falls in a sampled block
    d = checkpoint(tmp_path / "d", 0)
    data = bytearray((d / "model.safetensors").read_bytes())
    stride = (len(data) - provenance.SAMPLE_BYTES) // (provenance.SAMPLES - 1)
    data[7 * stride + 5] ^= 0xFF
    (d / "model.safetensors").write_bytes(bytes(data))
    assert checkpoint_fingerprint(d) != a


def test_single_file_checkpoint(tmp_path: Path) -> None:
    gguf = tmp_path / "model.gguf"
    gguf.write_bytes(bytes(range(256)) * 20_000)  # 5 MB
    fp = checkpoint_fingerprint(gguf)
    assert fp["hashed"] == FINGERPRINTED
    assert checkpoint_fingerprint(gguf, full=True)["sha256"] == file_sha256(gguf)


@pytest.mark.parametrize("full", [False, True])
def test_deterministic(tmp_path: Path, full: bool) -> None:
    ckpt = checkpoint(tmp_path / "a", 3)
    assert checkpoint_fingerprint(ckpt, full=full) == checkpoint_fingerprint(ckpt, full=full)
