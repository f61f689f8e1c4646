"""The energies of a response measured from its own per-token scores `s_t = ∇θ log π(y_t | ·)`
in place of the proxy `w_t` (docs/theory.md §3–4; the registry's `TRUE_ENERGIES`), from what a
full-mode measurement gives: the projections `u_t = P s_t` (`[B, T, k]`, `E[Pᵀ P] = I`, so
`E[u_t · u_t'] = s_t · s_t'`) and `‖s_t‖²` (`[B, T]`: exact in reverse mode, `‖u_t‖²` in
forward mode).

- `true` (`otb-true`, `optseq-true`): the per-token `‖s_t‖²`, which a baseline accumulates to
  `W_t = Σ_{j≤t} ‖s_j‖²`. Its total `W_T = Σ_t ‖s_t‖²` is the sum of the tokens' squared norms,
  not the sequence score's: it leaves out the cross terms `s_t · s_t'`, as the proxy's `W(τ)`
  does and as OTB's derivation assumes (uncorrelated token scores).
- `seqnorm-true` (`optseq-seqnorm-true`): the squared norm of the sequence's score
  `g(τ) = Σ_t m_t ρ_t s_t` (ρ the importance weights, 1 on-policy), the energy of the classic
  optimal sequence baseline: `B = E[R ‖g‖²] / E[‖g‖²]` minimises the variance of `(R − B) g`.

      ‖g‖² = Σ_t m_t ρ_t² ‖s_t‖²  +  Σ_{t≠t'} m_t m_t' ρ_t ρ_t' s_t · s_t'

  The diagonal comes from `‖s_t‖²` as given, the cross terms from the projections,
  `Σ_{t≠t'} c_t c_t' u_t · u_t' = ‖Σ_t c_t u_t‖² − Σ_t c_t² ‖u_t‖²` (`c = m ρ`), unbiased. So in
  reverse mode only the cross terms are estimates; in forward mode (`‖s_t‖² = ‖u_t‖²`) the
  whole is the JL estimate `‖Σ_t c_t u_t‖²`. Either way one `[B, T, k]` sum, the cost of
  `Σ_t ‖s_t‖²`. The true value is ≥ 0; an estimate the projection noise pushes below 0 is
  clipped to 0.
"""

from __future__ import annotations

import torch
from torch import Tensor

from otb_diag.maths.estimators.registry import SEQUENCE_NORM, TOKEN_NORMS


def sequence_sq_norm(
    proj: Tensor, sq_norm: Tensor, mask: Tensor, is_weights: Tensor | None = None
) -> Tensor:
    """`[B]` float64: `‖Σ_t m_t ρ_t s_t‖²` per response (see the module docstring).

    proj: `[B, T, k]` projected scores `u_t`; sq_norm: `[B, T]` `‖s_t‖²`; mask: `[B, T]`
    (1 on generated tokens); is_weights: `[B, T]` ρ, or None on-policy."""
    c = mask.double() if is_weights is None else mask.double() * is_weights.double()  # m_t ρ_t
    u = proj.double()
    total = torch.einsum("bt,btk->bk", c, u)  # Σ_t c_t u_t
    diagonal = (c.square() * sq_norm.double()).sum(-1)  # Σ_t c_t² ‖s_t‖²
    projected_diagonal = (c.square() * u.square().sum(-1)).sum(-1)  # Σ_t c_t² ‖u_t‖²
    cross = total.square().sum(-1) - projected_diagonal  # Σ_{t≠t'} c_t c_t' u_t·u_t'
    return (diagonal + cross).clamp_min(0.0)


def score_energies(
    proj: Tensor, sq_norm: Tensor, mask: Tensor, is_weights: Tensor | None = None
) -> dict[str, Tensor]:
    """The energy sources of the registry's `TRUE_ENERGIES`, for `paired_draws`' `energies`:
    `true` the per-token `‖s_t‖²` (`[B, T]`), `seqnorm-true` the sequence's `‖Σ_t s_t‖²`
    (`[B]`, importance weights in it). Arguments as `sequence_sq_norm`."""
    return {
        TOKEN_NORMS: sq_norm,
        SEQUENCE_NORM: sequence_sq_norm(proj, sq_norm, mask, is_weights),
    }
