"""How responses are drawn (temperature, truncation, length): declared once, for the command
line and the API (no torch at import: the command line is built from it)."""

from __future__ import annotations

from dataclasses import dataclass

from otb_diag.knobs import Checked, above, at_least, knob


@dataclass(frozen=True)
class Sampling(Checked):
    """Sampling settings: temperature τ > 0, `top_k` (0 = off), `top_p` (1.0 = off)."""

    temperature: float = knob(
        1.0, above(0), help="Sampling temperature τ (the policy is softmax(z/τ))."
    )
    top_k: int = knob(0, at_least(0), help="Top-k truncation (0 = off; recorded and flagged).")
    top_p: float = knob(
        1.0,
        lambda p: None if 0 < p <= 1 else f"must lie in (0, 1], got {p}",
        help="Nucleus truncation (1 = off; recorded and flagged).",
    )
    max_new_tokens: int = knob(128, at_least(1), help="Longest response, EOS included.")

    @property
    def from_policy(self) -> bool:
        """Whether samples come from `softmax(z/τ)` itself (no truncation), as the variance
        theory assumes."""
        return self.top_k == 0 and self.top_p >= 1.0
