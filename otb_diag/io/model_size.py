"""How many parameters a checkpoint's model has, read from its safetensors headers without
loading it: the size of the work that sets a command's threads
(`otb_diag/runtime/threads.py:choose_threads`), known before torch runs anything."""

from __future__ import annotations

import json
import math
from pathlib import Path

from otb_diag.errors import InputError

HEADER_BYTES = 8  # a safetensors file opens with its JSON header's length, little-endian u64


def parameter_count(path: Path) -> int | None:
    """The parameters of the model at `path` (a checkpoint directory, or a run directory: its
    first checkpoint's), summed over the tensor shapes of its `*.safetensors` headers. None
    where that cannot be read without loading the model (a .gguf file, pickled weights, a path
    that is no checkpoint: the command's own checks say why when it loads it)."""
    from otb_diag.io.checkpoint import find_checkpoints

    try:
        folder = find_checkpoints(path)[0]
        files = sorted(folder.glob("*.safetensors")) if folder.is_dir() else []
        return sum(_header_parameters(f) for f in files) if files else None
    except (InputError, OSError, ValueError, KeyError, TypeError):
        return None


def largest_model(paths: list[Path | None]) -> int | None:
    """The largest `parameter_count` of the models at `paths`; None where one's cannot be read
    (None among `paths`: a checkpoint not found)."""
    counts = [None if path is None else parameter_count(path) for path in paths]
    return None if any(c is None for c in counts) else max(c for c in counts if c is not None)


def _header_parameters(path: Path) -> int:
    """Σ over the tensors of one safetensors file of Π shape (its header only: a few KB)."""
    with path.open("rb") as handle:
        length = int.from_bytes(handle.read(HEADER_BYTES), "little")
        header = json.loads(handle.read(length))
    return sum(
        math.prod(entry["shape"]) for name, entry in header.items() if name != "__metadata__"
    )
