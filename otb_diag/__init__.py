"""otb-diag: gradient-variance diagnostics for RL of language models.

The public Python API (`otb_diag.api`, documented in the README's "Python API"): read rollouts,
load a checkpoint, per-token statistics, advantages under any registry baseline, the energy
tables, variance-compare and the collapse rule. Names resolve on first use, so `import otb_diag`
(and the CLI's `--help`) does not import torch or transformers.

Layers (ARCHITECTURE.md), each importing only those before it: `errors` ← `maths` (pure tensor
maths) and `dynamics` (rules over training-log tables) ← `runtime` (devices, torchrun, memory) ←
`policy` (running the model) ← `io` (files, checkpoints) ← `plots` ← `lab` (the embedded toy
labs) ← `pipelines` (one per command) ← `api`, `cli` (the Typer app, installed as
`otb_diag.cli`)."""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"

__all__ = [
    "DetectionRule",
    "InputError",
    "advantages",
    "baseline_names",
    "detect_collapse",
    "embedded_default",
    "energy_tables",
    "load_checkpoint",
    "read_rollouts",
    "read_training_log",
    "register_baseline",
    "response_batch",
    "token_statistics",
    "variance_compare",
]


def __getattr__(name: str) -> Any:
    if name == "InputError":
        from otb_diag.errors import InputError

        return InputError
    if name in __all__:
        from otb_diag import api

        return getattr(api, name)
    raise AttributeError(f"module 'otb_diag' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
