"""How much memory a run may use: the device's free memory, read where the platform keeps it, and
the chunk sizes planned from it."""

from __future__ import annotations

import os

import torch

from otb_diag.errors import InputError


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


def rows_that_fit(
    free_bytes: float, bytes_per_row: float, *, share: float, smallest: int, largest: int
) -> int:
    """The chunk size: the largest power of two `c` in `[smallest, largest]` with
    `c · bytes_per_row ≤ share · free_bytes`, or `smallest` when even that does not fit (the
    caller's own memory check then decides). Powers of two keep matrix shapes kernel-friendly and
    the plan stable when the free memory moves a little between runs."""
    if bytes_per_row <= 0 or not 1 <= smallest <= largest:
        raise InputError(
            f"rows_that_fit needs bytes_per_row > 0 and 1 <= smallest <= largest, got "
            f"{bytes_per_row}, {smallest}, {largest}"
        )
    fit = min(largest, int(share * free_bytes // bytes_per_row))  # rows that fit, capped
    if fit < smallest:
        return smallest
    return max(smallest, 1 << (fit.bit_length() - 1))  # 2^⌊log2 fit⌋
