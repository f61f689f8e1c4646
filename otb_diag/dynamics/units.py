"""Which of a training log's variance signals mix units (docs/theory.md §4.1).

verl's (and our `train`'s) `proxy3_pure_noise = max(0, (proxy2 − proxy1) / (N − 1))` subtracts
`proxy1 = ‖ḡ‖² = actor/grad_norm²`, a squared norm of the *parameter* gradient, from
`proxy2 = mean_i Ā_i² · W(τ_i)`, a realized energy in *logit* space (a sum of `‖∂ log p_t/∂z_t‖²`,
without the `‖h_t‖²` factor that makes it a parameter-gradient norm). The two have different
units and scales, so their difference is not the noise of the gradient, and an SNR formed from
it (or from `proxy1 / proxy2`) is not one either. A logged scalar pair in one space does not
exist in these logs: the SNR in consistent units is `variance-compare`'s (`|G|²` and `tr Σ` both
from projected parameter-space scores, `snr` at `--prompts-per-step`).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

MIXED_UNITS = (
    "proxy3_pure_noise subtracts actor/grad_norm² (parameter space) from proxy2 (logit-space "
    "energy, no ‖h‖² factor): mixed units, not a noise estimate, and no SNR can be formed "
    "from them; the SNR in one space is variance-compare's (--mode head or full, snr at "
    "--prompts-per-step)"
)


def proxy_units(frame: pd.DataFrame) -> dict[str, Any]:
    """`proxy3_mixes_units`: the run's log carries `proxy3_pure_noise` values beside its
    gradient norm (`frame`: a tidy table of `io/training_logs.py`); `note` says why that
    matters, None otherwise."""
    proxy3 = frame["proxy3_pure_noise"].to_numpy(dtype=float)
    grad = frame["grad_norm"].to_numpy(dtype=float)
    mixed = bool(np.isfinite(proxy3).any() and np.isfinite(grad).any())
    return {"proxy3_mixes_units": mixed, "units_note": MIXED_UNITS if mixed else None}
