"""Where a pass's tensors go. Every public entry of `policy/` takes its tensors on any device and
moves them once, at the entry, so that no kernel ever sees two devices: the index work (padding,
the valid `(row, t)` pairs, the checks) runs where the caller's ids are, the model's work on the
model's device, and a `ResponseBatch`, the host's description of its rows, on the CPU
(`host_batch`). Issue 48: `response_token_stats` given `response_start` on the CPU and
`input_ids` on CUDA stopped at its first comparison, which no CPU test could see;
`tests/virtual_devices.py` now simulates a device on the CPU for every entry's test
(`tests/policy/test_placement.py`).
"""

from __future__ import annotations

import dataclasses

import torch
from torch import Tensor, nn

from otb_diag.maths.response_batch import ResponseBatch
from otb_diag.policy.causal_lm import causal_lm


def input_device(model: nn.Module) -> torch.device:
    """Where `model` reads its input ids: its input embedding's device (the first device of a
    model that accelerate spread over several, whose hooks move the rest; a PEFT wrapper's
    causal LM's, `causal_lm`)."""
    return causal_lm(model).get_input_embeddings().weight.device


def to_device(x: Tensor, device: torch.device) -> Tensor:
    """`x` on `device`; from the CPU to CUDA without waiting for the device: a pinned copy is
    queued on CUDA's stream, where a pageable one would first wait for the work queued before it
    (the caching host allocator keeps the pinned block until the copy is done)."""
    if device.type != "cuda" or x.device.type != "cpu":
        return x.to(device)
    return x.pin_memory().to(device, non_blocking=True)


def host_batch(batch: ResponseBatch) -> ResponseBatch:
    """`batch` with every tensor on the CPU (itself when they all are): the policy's passes read
    a batch's lengths and ids on the host and send what the model needs to its device."""
    moved = {
        name: value.cpu()
        for name, value in vars(batch).items()
        if isinstance(value, Tensor) and value.device.type != "cpu"
    }
    if not moved:
        return batch
    if dataclasses.is_dataclass(batch):
        return dataclasses.replace(batch, **moved)
    return type(batch)(**{**vars(batch), **moved})  # a stand-in with the fields a pass reads
