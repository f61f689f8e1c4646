"""A dumped training step whose groups have become all-correct, with an aborted generation:
the fixture of issue 34's zero tail and empty responses (tests/pipelines/test_energy_zero_tail.py,
tests/integrations/test_live_zero_tail.py)."""

from __future__ import annotations

import json
import math
from pathlib import Path

# Per-token (p, Σπ²) at τ = 1: w = 1 − 2p + Σπ².
BODY = (0.5, 0.4)  # w = 0.4
TAIL = (0.1, 0.3)  # w = 1.1
W_BODY, W_TAIL = 1 - 2 * BODY[0] + BODY[1], 1 - 2 * TAIL[0] + TAIL[1]
SECOND, LONGEST = 3, 6  # an all-correct group's two longest members: the tail is t = 3, 4, 5


def row(group: str, tokens: list[tuple[float, float]], reward: float) -> dict:
    return {
        "group": group,
        "step": 22,
        "prompt_ids": [5, 6],
        "response_ids": [7] * len(tokens),
        "reward": reward,
        "logprobs": [math.log(p) for p, _ in tokens],
        "sum_pi2": [s for _, s in tokens],
        "temperature": 1.0,
    }


def dumped_step(path: Path) -> Path:
    """Two all-correct groups (lengths 2, 2, 3, 6: one strictly longest member) and a mixed one
    (lengths 0, 2, 4, 4; the 0 an aborted generation, reward 0, still one of its 4)."""
    rows = []
    for g in ("all-correct-a", "all-correct-b"):
        for n in (2, 2, SECOND):
            rows.append(row(g, [BODY] * n, 1.0))
        rows.append(row(g, [BODY] * SECOND + [TAIL] * (LONGEST - SECOND), 1.0))
    for n, reward in ((0, 0.0), (2, 1.0), (4, 0.0), (4, 1.0)):
        rows.append(row("mixed", [BODY] * n, reward))
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path
