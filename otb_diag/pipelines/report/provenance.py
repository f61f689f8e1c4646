"""Where each number of the report came from: the exact command that reproduces a run (and so
its figures), rebuilt from the settings its record holds, and the files with their SHA-256."""

from __future__ import annotations

import shlex
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from otb_diag.io.provenance import directory_sha256, file_sha256
from otb_diag.pipelines.energy.settings import EnergySettings
from otb_diag.pipelines.results.read import Result
from otb_diag.pipelines.results.schema import RunInputs
from otb_diag.pipelines.variance.settings import VarianceSettings


def _flags(pairs: list[tuple[str, Any]]) -> list[str]:
    """CLI words for (option, value) pairs: None is left out, True is a bare flag (False
    too), a list or tuple is comma-joined."""
    words: list[str] = []
    for option, value in pairs:
        if value is None or value is False:
            continue
        if value is True:
            words.append(option)
        elif isinstance(value, (list, tuple)):
            words += [option, ",".join(str(v) for v in value)]
        else:
            words += [option, str(value)]
    return words


def _load_flags(settings: EnergySettings | VarianceSettings) -> list[tuple[str, Any]]:
    load = settings.load
    return [
        ("--device", load.device),
        ("--dtype", load.dtype),
        ("--allow-pickle", load.allow_pickle),
        ("--trust-remote-code", load.trust_remote_code),
    ]


def _zero_tail(settings: EnergySettings | VarianceSettings) -> list[tuple[str, Any]]:
    on = settings.handle_zero_tail
    return [("--handle-zero-tail" if on else "--no-handle-zero-tail", True)]


def _inputs(inputs: RunInputs) -> list[tuple[str, Any]]:
    pairs = [("--ckpt", path) for path in inputs.checkpoint_paths]
    return pairs + [("--rollouts", inputs.rollouts_path)]


def _named(settings: object, names: tuple[str, ...]) -> list[tuple[str, Any]]:
    """(option, value) for settings whose option is the field's name with dashes (`modes` is
    `--mode`)."""
    options = {"modes": "--mode"}
    return [(options.get(k, f"--{k.replace('_', '-')}"), getattr(settings, k)) for k in names]


def command(command_name: str, result: Result, out: Path) -> str:
    """The `otb-diag ...` line that rewrites the run directory `out` with the same settings
    (`result`: the run's result)."""
    if command_name in ("energy", "variance-compare"):
        s = result.settings
        keys = (
            ("baselines", "temperature", "group")
            if command_name == "energy"
            else ("modes", "baselines", "aggregations", "group_sizes", "draws", "bootstrap")
            + ("sketch_dim", "seed", "force", "temperature")
        )
        pairs = _inputs(result.inputs) + [("--model-free", result.model_free)] + _named(s, keys)
        pairs += _named(s, ("batch_tokens", "chunk_size")) + _zero_tail(s) + _load_flags(s)
    elif command_name == "train":
        pairs = [("--ckpt", result.checkpoint)] + _named(
            result.settings,
            ("baseline", "group_size", "aggregation", "prompts_per_step", "lr", "steps")
            + ("max_new_tokens", "temperature", "seed", "save_every", "max_grad_norm"),
        )
    else:  # dynamics
        pairs = [p for r in result.runs for p in (("--log", r.file), ("--label", r.run))]
        pairs += _named(
            result.rule,
            ("window", "threshold", "persist", "lead_threshold", "lead_horizon", "smooth"),
        )
        pairs.append(("--target", result.target))
    return shlex.join(["otb-diag", command_name, *_flags(pairs), "--out", str(out)])


def input_files(command_name: str, result: Result) -> Iterator[tuple[str, str, str]]:
    """(what, path, SHA-256) of each input: as recorded by the run, or hashed now (marked so)
    for the commands whose record does not hash its inputs."""
    if command_name in ("energy", "variance-compare"):
        inputs: RunInputs = result.inputs
        yield "rollouts", inputs.rollouts_path, inputs.rollouts_sha256 or "—"
        for c in inputs.checkpoints:
            yield f"checkpoint (step {c.step})", c.path, c.sha256 or "—"
    if command_name == "train":
        yield "checkpoint (start)", result.checkpoint, _hash_now(Path(result.checkpoint))
    if command_name == "dynamics":
        for r in result.runs:
            yield f"training log ({r.run})", r.file, _hash_now(Path(r.file))


def _hash_now(path: Path) -> str:
    if path.is_file():
        return file_sha256(path) + " (hashed now)"
    if path.is_dir():
        return directory_sha256(path) + " (hashed now)"
    return "— (no longer there)"
