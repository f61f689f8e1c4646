"""Float tolerances that hold on any machine: an error is judged against the size of what is
compared, never against an absolute 1e-7 (float32 sums reorder with the BLAS, the CPU and the
thread count, and a gradient element near zero then differs by a few ulps of its neighbours)."""

from __future__ import annotations

import torch


def assert_close_to_norm(
    actual: torch.Tensor, expected: torch.Tensor, rel: float = 1e-5, msg: str = ""
) -> None:
    """Every element of `actual` lies within `rel · ‖expected‖` (Frobenius) of `expected`.

    Measured on the toy model's full gradient: float32 reordering moves elements by at most
    ~4e-7 of their tensor's norm, so `rel = 1e-5` leaves 25× room, while a wrong gradient (a
    missing term, a sign, a transposed block) moves elements by a sizeable fraction of it."""
    assert actual.shape == expected.shape, f"{msg}: shape {actual.shape} != {expected.shape}"
    scale = expected.double().norm().item()
    err = (actual.double() - expected.double()).abs().max().item()
    assert err <= rel * scale, f"{msg}: max |Δ| {err:.3g} > {rel:g} · ‖expected‖ ({scale:.3g})"
