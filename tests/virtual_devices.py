"""Devices that the CPU-only torch does not have, simulated on the CPU: every tensor carries a
device label (`cuda:0` for the model's weights, say) while its data stays on the CPU, and every
torch call checks its tensors' labels as the kernels of a real device would, raising torch's own
"Expected all tensors to be on the same device" where they mix. So a device mix that only a GPU
shows (issue 48: `response_token_stats` given `response_start` on the CPU and `input_ids` on
CUDA) fails here, on the CPU, in the real code path.

How: one `TorchFunctionMode` sees every torch function, `Tensor` method and property:
- `Tensor.device` (and `is_cuda`) answer the label, so the code under test takes the branches it
  takes on that device (`placement.to_device`'s pinned copy, `stats_plan`'s CUDA plan...);
- `Tensor.to` / `cuda` / `cpu` relabel (a copy, as between real devices), `pin_memory` is the
  identity, `is_pinned` answers False;
- factory functions (`torch.zeros(..., device=d)`, `arange`, `empty`...) run on the CPU and label
  their result `d` (no `device`: the CPU, as torch's default);
- every other call checks the labels of its tensor arguments (a 0-dim CPU tensor mixes with any
  device, as in torch; indexing accepts CPU indices) and labels its outputs with theirs.

Host reads: a read of a device tensor's values on the host (`item`, `tolist`, `bool()`, `cpu()`,
`nonzero`...) waits for the device's queue; `reads` lists each one's function, so a test bounds
what a pass costs the host.

`torch.cuda`'s own calls, which the CPU-only build refuses, are stood in for inside the block:
`mem_get_info` answers `free_bytes` of `total_bytes`, `synchronize` does nothing, and a
`torch.Generator` asked for on CUDA is a CPU one (its numbers differ from a real CUDA
generator's; placement does not depend on them). Kernels the CUDA build alone has run as their
CPU selves.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator
from typing import Any
from unittest import mock

import torch
from torch import Tensor, nn
from torch._C import _functorch
from torch.overrides import TorchFunctionMode
from torch.utils._device import _device_constructors
from torch.utils._pytree import tree_flatten
from torch.utils.weak import WeakIdKeyDictionary

CPU = torch.device("cpu")
_INDEXING = {Tensor.__getitem__, Tensor.__setitem__}  # advanced indexing takes CPU indices
# Reads of a tensor's values on the host (`Tensor.cpu` and `to("cpu")` are counted where moved).
_READS = {
    Tensor.item, Tensor.tolist, Tensor.__bool__, Tensor.__int__, Tensor.__float__,
    Tensor.__index__, Tensor.numpy, Tensor.nonzero, torch.nonzero,
}  # fmt: skip


class DeviceMix(RuntimeError):
    """Tensors on two devices met in one call (torch's own message, and the call)."""


def _device(spec: str | torch.device | None) -> torch.device:
    device = torch.device(spec or CPU)
    return torch.device("cuda", 0) if device.type == "cuda" and device.index is None else device


class VirtualDevices(TorchFunctionMode):
    """The mode (module docstring). `place(x, "cuda")` labels tensors (any pytree of them, a
    `ResponseBatch`'s fields) or a module's parameters and buffers; `device_of(t)` reads a label;
    `reads` lists the host reads of device tensors.

    A tensor that no call of the block made and no `place` labelled (the inputs a test forgot,
    the outputs functorch's transforms build in C++) has no label: it matches any device, so
    it can hide a mix but never invent one."""

    def __init__(self) -> None:
        super().__init__()
        self.labels: WeakIdKeyDictionary = WeakIdKeyDictionary()
        self.reads: list[str] = []

    def place(self, x: Any, device: str | torch.device) -> Any:
        device = _device(device)
        if isinstance(x, nn.Module):
            tensors = [*x.parameters(), *x.buffers()]
        elif dataclasses.is_dataclass(x):
            tensors = [getattr(x, f.name) for f in dataclasses.fields(x)]
        else:
            tensors = tree_flatten(x)[0]
        for t in tensors:
            if isinstance(t, Tensor):
                self.labels[t] = device
        return x

    def device_of(self, t: Tensor) -> torch.device | None:
        """`t`'s label, None where it has none; a functorch wrapper's (`vmap`, `grad`, `jvp`
        wrap a tensor in a new object) is that of the tensor it wraps."""
        while t not in self.labels and _functorch.is_functorch_wrapped_tensor(t):
            t = _functorch.get_unwrapped(t)
        return self.labels.get(t)

    def _on_device(self, t: Tensor) -> bool:
        device = self.device_of(t)
        return device is not None and device != CPU

    def __torch_function__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        kwargs = kwargs or {}
        if func in _READS and self._on_device(args[0]):
            self.reads.append(func.__name__)
        getter = getattr(func, "__self__", None)  # a property's `__get__`
        if getter is Tensor.device or getter is Tensor.is_cuda:
            device = self.device_of(args[0]) or func(*args)
            return device if getter is Tensor.device else device.type == "cuda"
        if func in (Tensor.to, Tensor.cuda, Tensor.cpu):
            return self._moved(func, args, kwargs)
        if func is Tensor.pin_memory:
            return args[0]
        if func is Tensor.is_pinned:
            return False
        if func in _device_constructors():
            device = _device(kwargs.pop("device", None))
            return self._labelled(func(*args, **kwargs), device)
        if func is Tensor.copy_:  # between devices, as torch copies
            return func(*args, **kwargs)
        return self._labelled(func(*args, **kwargs), self._common(func, args, kwargs))

    def _labelled(self, out: Any, device: torch.device | None) -> Any:
        if device is not None:
            for t in tree_flatten(out)[0]:
                if isinstance(t, Tensor):
                    self.labels[t] = device
        return out

    def _moved(self, func, args, kwargs):  # noqa: ANN001
        """`to` / `cuda` / `cpu`: the same values, labelled with the target (a copy where the
        device changes, as between two real devices)."""
        x, copy, dtype = args[0], False, None
        if func is Tensor.cuda:
            target = _device("cuda")
        elif func is Tensor.cpu:
            target = CPU
        else:
            copy = kwargs.pop("copy", False)
            device, dtype, _, _ = torch._C._nn._parse_to(*args[1:], **kwargs)
            other = args[1] if len(args) > 1 and isinstance(args[1], Tensor) else None
            target = self.device_of(other) if other is not None else device
            target = self.device_of(x) if target is None else _device(target)
        out = x if dtype is None else x.to(dtype)
        source = self.device_of(x)
        if target != source or (copy and out is x):
            out = out.clone()
            if target == CPU and source not in (None, CPU):
                self.reads.append("cpu")
        return self._labelled(out, target)

    def _common(self, func, args, kwargs) -> torch.device | None:  # noqa: ANN001
        """The device of a call's tensors, or DeviceMix where a real device would refuse them."""
        if func in _INDEXING:
            return self._indexed(func, args)
        tensors = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, Tensor)]
        known = [d for t in tensors if (d := self.device_of(t)) is not None]
        devices = {
            d
            for t, d in zip(tensors, map(self.device_of, tensors), strict=True)
            if d is not None and not (d == CPU and t.dim() == 0)
        }  # fmt: skip  (a 0-dim CPU tensor mixes with any device, as in torch)
        if len(devices) > 1:
            raise DeviceMix(_message(func, *sorted(devices, key=str)[:2]))
        if devices:
            return devices.pop()
        return CPU if known else None

    def _indexed(self, func, args) -> torch.device | None:  # noqa: ANN001
        """`x[index]`, `x[index] = value`: the index tensors on the CPU or on x's device, the value
        on x's device (or a 0-dim CPU tensor)."""
        x, index = args[0], args[1]
        value = args[2] if func is Tensor.__setitem__ else None
        device = self.device_of(x)
        for t in tree_flatten(index)[0]:
            if isinstance(t, Tensor) and self.device_of(t) not in (device, CPU, None):
                raise DeviceMix(_message(func, device, self.device_of(t)))
        given = self.device_of(value) if isinstance(value, Tensor) and value.dim() > 0 else None
        if None not in (device, given) and given != device:
            raise DeviceMix(_message(func, device, given))
        return device


def _message(func: Any, a: torch.device, b: torch.device) -> str:
    name = getattr(func, "__name__", str(func))
    return (
        f"Expected all tensors to be on the same device, but found at least two devices, "
        f"{a} and {b}! (in {name})"
    )


class _HostGenerator(torch._C.Generator):
    """`torch.Generator(device=...)` inside the block: a CPU generator whatever the device."""

    def __new__(cls, device: Any = None) -> torch._C.Generator:  # noqa: ARG003
        return torch._C.Generator("cpu")


@contextlib.contextmanager
def virtual_devices(
    free_bytes: float = 8 * 2**30, total_bytes: float = 80 * 2**30
) -> Iterator[VirtualDevices]:
    """`with virtual_devices() as devices: devices.place(model, "cuda"); ...` (module docstring:
    `torch.cuda`'s calls stood in for, the device `free_bytes` free of `total_bytes`)."""
    with (
        mock.patch.object(
            torch.cuda, "mem_get_info", lambda *_: (int(free_bytes), int(total_bytes))
        ),
        mock.patch.object(torch.cuda, "synchronize", lambda *_: None),
        mock.patch.object(torch, "Generator", _HostGenerator),
        VirtualDevices() as mode,
    ):
        yield mode
