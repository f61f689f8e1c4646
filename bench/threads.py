"""The thread count a benchmark runs at, declared once per script (`--threads`, defaulting to
the count its tables in bench/README.md and docs/ were made at), set before it measures, handed
to the processes it starts, and printed with its numbers: torch orders its float sums by its
thread count (a training's tokens and scores follow), and on a busy machine a second thread
waits for a core (a step of bench_train_compare.py went from 0.07 s to 3 s beside another job).
A helper of the scripts, not a benchmark itself."""

from __future__ import annotations

import argparse
import os


def add_threads(parser: argparse.ArgumentParser, default: int) -> None:
    """`--threads N`: by default `$OMP_NUM_THREADS` where it is set (the documented commands
    that set it keep meaning what they meant), else `default`, the count the script's
    documented tables were made at."""
    given = os.environ.get("OMP_NUM_THREADS")
    parser.add_argument(
        "--threads",
        type=int,
        default=int(given) if given else default,
        help=f"torch threads, also for the processes it starts (default: $OMP_NUM_THREADS, "
        f"else {default}, as its documented tables were made)",
    )


def pin_threads(threads: int) -> str:
    """Run torch on `threads` intra-op threads, and the processes this one starts
    (`OMP_NUM_THREADS`), before anything is measured; returns the line the script prints: the
    count, the cores and the 1-minute load average, flagged where the machine is
    oversubscribed (its timings then say little)."""
    import torch

    torch.set_num_threads(threads)
    os.environ["OMP_NUM_THREADS"] = str(threads)
    cores, load = os.cpu_count() or 1, os.getloadavg()[0]
    line = f"threads: {threads} torch thread(s) on {cores} cores, 1-min load average {load:.2f}"
    if load + threads > cores:
        line += " (oversubscribed: timings taken beside other work say little)"
    return line
