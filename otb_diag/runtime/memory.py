"""How much memory a run may use: the device's free memory, read where the platform keeps it."""

from __future__ import annotations

import os

import torch


def available_memory(device: torch.device) -> float:
    """Bytes free for the run: CUDA's free memory, or the host's `MemAvailable` (Linux)."""
    if device.type == "cuda":
        return float(torch.cuda.mem_get_info(device)[0])
    try:
        with open("/proc/meminfo", encoding="ascii") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return float(line.split()[1]) * 1024
    except OSError:
        pass
    return float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES"))
