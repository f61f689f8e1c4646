"""Where a checkpoint runs: `--device` (one device; `auto` picks cuda, then mps, then cpu) and
`--device-map` (one checkpoint spread over several GPUs and CPU offload by accelerate).

Every problem is an `InputError` that names the option, raised before anything is loaded or
written: a device that this machine does not have is bad input, not a crash."""

from __future__ import annotations

import os
import sys
import time
from typing import Any

import torch

from otb_diag.errors import InputError

AUTO = "auto"
_said: set[str] = set()


def _cuda_count() -> int:
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def _mps_available() -> bool:
    backend = getattr(torch.backends, "mps", None)
    return bool(backend is not None and backend.is_available())


def _env_local_rank() -> int | None:
    """This process's GPU slot under torchrun (`LOCAL_RANK` when `WORLD_SIZE` > 1), else None."""
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        return int(os.environ.get("LOCAL_RANK", "0"))
    return None


def resolve_device(spec: str, *, local_rank: int | None = None) -> torch.device:
    """The `torch.device` that `--device` names, checked against this machine.

    `auto`: `cuda` when a GPU is visible, else `mps`, else `cpu`; said once on stderr (by rank 0
    only under torchrun). Under torchrun (`local_rank` given) a bare `cuda` (or `auto` on a GPU
    machine) means `cuda:<local_rank>`, one GPU per process.
    """
    local_rank = _env_local_rank() if local_rank is None else local_rank
    text = spec.strip().lower()
    if text == AUTO:
        if _cuda_count():
            device, why = torch.device("cuda"), f"{_cuda_count()} CUDA device(s) visible"
        elif _mps_available():
            device, why = torch.device("mps"), "Apple MPS available, no CUDA"
        else:
            device, why = torch.device("cpu"), "no CUDA or MPS device"
        if int(os.environ.get("RANK", "0")) == 0:
            _say_once(f"--device auto: using {device.type} ({why})")
    else:
        device = _parse_device(
            text, f"unknown device '{spec}'.", "device", "Use auto, cpu, cuda, cuda:N or mps."
        )
    _check_exists(device, spec, "device")
    if device.type == "cuda" and device.index is None and local_rank is not None:
        device = torch.device("cuda", local_rank)
        _check_exists(device, spec, "device")
    return device


def device_map_kwargs(spec: str | None) -> dict[str, Any]:
    """`from_pretrained` keywords for `--device-map`: {} when not given; `auto` spreads the
    checkpoint over every visible GPU, then CPU memory (accelerate's `device_map="auto"`); a
    comma-separated list (`cuda:0,cuda:1,cpu`) restricts it to those devices."""
    if spec is None:
        return {}
    _require_accelerate()
    text = spec.strip().lower()
    if text == AUTO:
        return {"device_map": AUTO}
    from accelerate.utils import get_max_memory

    available = get_max_memory()
    budget: dict[int | str, Any] = {}
    for part in (p.strip() for p in text.split(",") if p.strip()):
        device = _parse_device(
            part,
            f"unknown device '{part}' in --device-map '{spec}'.",
            "device-map",
            "Use auto or a comma-separated list such as cuda:0,cuda:1,cpu.",
        )
        _check_exists(device, part, "device-map")
        if device.type not in ("cuda", "cpu"):
            raise InputError(
                f"--device-map spreads a model over CUDA devices and the CPU, not {part}.",
                field="device-map",
            )
        key: int | str = "cpu" if device.type == "cpu" else (device.index or 0)
        budget[key] = available[key]
    if not budget:
        raise InputError("--device-map names no device.", field="device-map")
    return {"device_map": AUTO, "max_memory": budget}


def _parse_device(text: str, message: str, option: str, hint: str) -> torch.device:
    """`torch.device(text)`, or an `InputError` with `message` naming the option."""
    try:
        return torch.device(text)
    except RuntimeError:
        raise InputError(message, field=option, hint=hint) from None


def _check_exists(device: torch.device, spec: str, option: str) -> None:
    if device.type == "cuda":
        count = _cuda_count()
        if count == 0:
            raise InputError(
                f"--{option} {spec}: this machine has no CUDA device "
                f"(torch {torch.__version__}, CUDA build: {torch.version.cuda or 'no'}).",
                field=option,
                hint="Use --device auto (the default) or cpu.",
            )
        if device.index is not None and device.index >= count:
            raise InputError(
                f"--{option} {spec}: there is no CUDA device {device.index}; "
                f"{count} visible (cuda:0 to cuda:{count - 1}, CUDA_VISIBLE_DEVICES="
                f"{os.environ.get('CUDA_VISIBLE_DEVICES', 'unset')}).",
                field=option,
            )
    elif device.type == "mps" and not _mps_available():
        raise InputError(f"--{option} {spec}: MPS is not available here.", field=option)
    elif device.type not in ("cpu", "cuda", "mps"):
        raise InputError(
            f"--{option} {spec}: unsupported device type '{device.type}'.",
            field=option,
            hint="Use auto, cpu, cuda, cuda:N or mps.",
        )


def _require_accelerate() -> None:
    try:
        import accelerate  # noqa: F401
    except ImportError:
        raise InputError(
            "--device-map needs the accelerate package, which is not installed.",
            field="device-map",
            hint="pip install accelerate",
        ) from None


def _say_once(message: str) -> None:
    if message not in _said:
        _said.add(message)
        print(message, file=sys.stderr)


def device_seconds(device: torch.device) -> float:
    """`time.perf_counter()` once the work queued on `device` is done: differences of two reads
    time that work, where CUDA returns from a call before its kernels have run."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()
