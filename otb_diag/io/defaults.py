"""Where the embedded default (the toy lab shipped with the package) lives."""

from __future__ import annotations

from pathlib import Path

DEFAULT_DIR = Path(__file__).resolve().parent.parent / "lab" / "default"
DEFAULT_CHECKPOINTS_DIR = DEFAULT_DIR / "checkpoints"
DEFAULT_ROLLOUTS = DEFAULT_DIR / "rollouts.jsonl"
DEFAULT_TIR_ROLLOUTS = DEFAULT_DIR / "rollouts_tir.jsonl"


def default_checkpoints() -> list[Path]:
    """All shipped checkpoints of the toy training run, oldest first (`checkpoint-<step>`)."""
    dirs = [p for p in DEFAULT_CHECKPOINTS_DIR.glob("checkpoint-*") if p.is_dir()]
    return sorted(dirs, key=lambda p: int(p.name.split("-")[-1]))


def default_checkpoint() -> Path:
    """The final shipped checkpoint: the one the default rollouts were sampled from."""
    ckpts = default_checkpoints()
    if not ckpts:
        raise FileNotFoundError(f"no embedded checkpoint under {DEFAULT_CHECKPOINTS_DIR}")
    return ckpts[-1]
