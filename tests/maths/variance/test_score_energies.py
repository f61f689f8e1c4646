"""The energies measured from the scores themselves: the per-token `‖s_t‖²` (`-true`) and the
sequence score's `‖Σ_t s_t‖²` (`-seqnorm-true`), on hand cases with cross terms, and how the
registry, the paired draws and `optseq` take them."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from otb_diag.maths.energy.token_stats import cumulative_energy
from otb_diag.maths.estimators import registry
from otb_diag.maths.estimators.advantages import token_advantages
from otb_diag.maths.estimators.registry import SEQUENCE_NORM, TOKEN_NORMS, TRUE_ENERGIES
from otb_diag.maths.returns import outcome_token_rewards, returns_to_go
from otb_diag.maths.variance.paired_draws import (
    BaselineSpec,
    default_specs,
    draw_estimates,
    draw_groups,
    pool_rows,
    pool_score_means,
)
from otb_diag.maths.variance.score_energies import score_energies, sequence_sq_norm

F64 = torch.float64

# Two responses of two tokens with scores in R²: the first's tokens point the same way
# (s_1·s_2 = 1), the second's cancel (s_1·s_2 = −1); the third token is padding.
SCORES = torch.tensor(
    [[[1.0, 0.0], [1.0, 1.0], [7.0, 7.0]], [[1.0, 0.0], [-1.0, 0.0], [0.0, 0.0]]], dtype=F64
)
MASK = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 0.0]], dtype=F64)
SQ_NORM = SCORES.square().sum(-1)  # exact per-token ‖s_t‖²


def test_the_sequence_norm_keeps_the_cross_terms_the_token_sum_leaves_out() -> None:
    """With the identity as projection (u_t = s_t): Σ_t ‖s_t‖² is 1 + 2 = 3 and 1 + 1 = 2;
    ‖Σ_t s_t‖² is ‖(2, 1)‖² = 5 and ‖(0, 0)‖² = 0: they differ by 2 Σ_{t<t'} s_t·s_t' = +2, −2."""
    energies = score_energies(SCORES, SQ_NORM, MASK)
    token_sum = cumulative_energy(energies[TOKEN_NORMS], MASK)[:, -1]
    torch.testing.assert_close(token_sum, torch.tensor([3.0, 2.0], dtype=F64))
    torch.testing.assert_close(energies[SEQUENCE_NORM], torch.tensor([5.0, 0.0], dtype=F64))
    cross = 2 * (SCORES[:, 0] * SCORES[:, 1]).sum(-1)
    torch.testing.assert_close(energies[SEQUENCE_NORM] - token_sum, cross)


def test_importance_weights_weight_each_token_score() -> None:
    """ρ = (2, 1): ‖2 s_1 + s_2‖² = ‖(3, 1)‖² = 10 and ‖(1, 0)‖² = 1 (padding's ρ unused)."""
    rho = torch.tensor([[2.0, 1.0, 9.0], [2.0, 1.0, 9.0]], dtype=F64)
    got = sequence_sq_norm(SCORES, SQ_NORM, MASK, rho)
    torch.testing.assert_close(got, torch.tensor([10.0, 1.0], dtype=F64))


def test_exact_diagonal_plus_projected_cross_terms_is_unbiased() -> None:
    """Reverse mode: `‖s_t‖²` exact, the projections a Gaussian JL sketch (k = 4 of d = 40): the
    estimate's mean over 4,000 independent projections is ‖Σ_t s_t‖² within 4 standard errors,
    and in forward mode (`‖s_t‖²` = `‖u_t‖²`) each estimate is `‖Σ_t u_t‖²` exactly."""
    gen = torch.Generator().manual_seed(3)
    s = torch.randn(1, 5, 40, generator=gen, dtype=F64) + 0.5  # correlated tokens: a common mean
    mask = torch.ones(1, 5, dtype=F64)
    truth = float(s.sum(1).square().sum())
    k, trials = 4, 4000
    p = torch.randn(trials, 40, k, generator=gen, dtype=F64) / k**0.5  # E[P Pᵀ] = I
    u = torch.einsum("btd,rdk->rbtk", s, p)  # [trials, 1, 5, k]
    exact = s.square().sum(-1)
    estimates = torch.stack([sequence_sq_norm(u[r], exact, mask)[0] for r in range(trials)])
    error = float(estimates.std()) / trials**0.5
    assert abs(float(estimates.mean()) - truth) < 4 * error, (float(estimates.mean()), truth)
    forward = sequence_sq_norm(u[0], u[0].square().sum(-1), mask)
    torch.testing.assert_close(forward, u[0].sum(1).square().sum(-1))


def test_optseq_on_the_two_energies_differs_by_the_computed_amount() -> None:
    """One group of the two hand responses, rewards (1, 0): `optseq` weights R by its energy,
    B = Σ R_j E_j / Σ E_j. On Σ_t ‖s_t‖² (3, 2): B = 3/5 = 0.6; on ‖Σ_t s_t‖² (5, 0): B = 1.
    The first response's advantage moves from 0.4 to 0, the second's from −0.6 to −1."""
    returns = returns_to_go(outcome_token_rewards(torch.tensor([1.0, 0.0], dtype=F64), MASK), MASK)
    group = torch.zeros(2, dtype=torch.long)
    energies = score_energies(SCORES, SQ_NORM, MASK)
    on_tokens = token_advantages(
        "optseq", returns, MASK, group, cumulative_energy(energies[TOKEN_NORMS], MASK)
    )
    on_sequence = token_advantages("optseq", returns, MASK, group, energies[SEQUENCE_NORM])
    torch.testing.assert_close(on_tokens[:, 0], torch.tensor([0.4, -0.6], dtype=F64))
    torch.testing.assert_close(on_sequence[:, 0], torch.tensor([0.0, -1.0], dtype=F64))
    torch.testing.assert_close(on_tokens - on_sequence, 0.4 * MASK)  # B moved by 1 − 3/5


def test_the_registry_names_each_energy_and_who_takes_it() -> None:
    specs = default_specs(["none", "mean", "otb", "optseq"], list(TRUE_ENERGIES))
    by_label = {s.label: (s.name, s.energy) for s in specs}
    assert by_label["otb-true"] == ("otb", TOKEN_NORMS)
    assert by_label["optseq-true"] == ("optseq", TOKEN_NORMS)
    assert by_label["optseq-seqnorm-true"] == ("optseq", SEQUENCE_NORM)
    assert "otb-seqnorm-true" not in by_label  # OTB's W_t is per token: no sequence norm
    assert registry.split_label("optseq-seqnorm-true") == ("optseq", SEQUENCE_NORM)
    assert registry.split_label("otb-loo-true") == ("otb-loo", TOKEN_NORMS)
    assert registry.family_of("optseq-seqnorm-true") == "optseq"
    assert registry.variant_of("optseq-seqnorm-true") == "seqnorm-true"
    assert registry.variant_of("otb-loo-true") == "loo-true"
    with pytest.raises(ValueError, match="unknown true_energies"):
        registry.register_baseline("test-never-registered", true_energies=("exact",))(
            lambda returns, mask, group, energy: returns * mask
        )
    assert "test-never-registered" not in registry.BASELINES


def test_a_per_response_energy_is_drawn_with_its_rows_and_given_no_second_rho() -> None:
    """In the paired draws a `[B]` energy follows its rows, and since ρ is already in it the
    baseline is not handed ρ again: its draws are the same with or without the pool's ρ."""
    gen = torch.Generator().manual_seed(0)
    rows, length, k = 16, 4, 3
    mask = torch.ones(rows, length, dtype=F64)
    scores = torch.randn(rows, length, k, generator=gen, dtype=F64)
    reward = (torch.rand(rows, generator=gen) < 0.5).to(F64)
    returns = returns_to_go(outcome_token_rewards(reward, mask), mask)
    group = torch.arange(2).repeat_interleave(8)
    rho = torch.rand(rows, length, generator=gen, dtype=F64) + 0.5
    energies = {"proxy": torch.rand(rows, length, generator=gen, dtype=F64)}
    energies |= score_energies(scores, scores.square().sum(-1), mask, rho)
    specs = [
        BaselineSpec("none", "none"),
        BaselineSpec("mean", "mean"),
        BaselineSpec("optseq-seqnorm-true", "optseq", SEQUENCE_NORM),
    ]
    drawn = draw_groups(pool_rows(group), 4, 20, np.random.default_rng(1))
    centres = pool_score_means(scores, mask, group)

    def estimates(is_weights: torch.Tensor | None) -> np.ndarray:
        out = draw_estimates(
            returns, mask, scores, energies, drawn, centres, specs, ["token-sum"],
            is_weights=is_weights,
        )  # fmt: skip
        return out["token-sum", "optseq-seqnorm-true"].g

    g = estimates(rho)
    np.testing.assert_array_equal(g, estimates(None))
    # draw 0 by hand: per prompt B = Σ R_j E_j / (Σ E_j + ε) over its drawn rows, token-sum
    # weights 1/(P·N), g = Σ_i Σ_t c (R_i − B) s_it
    by_hand = torch.zeros(k, dtype=F64)
    for sub in drawn[0]:
        e, r = energies[SEQUENCE_NORM][sub], reward[sub]
        baseline = (r * e).sum() / (e.sum() + 1e-8)
        by_hand += torch.einsum("i,itk->k", r - baseline, scores[sub]) / 8
    np.testing.assert_allclose(g[0], by_hand.numpy(), rtol=1e-12)


def test_an_estimate_below_zero_is_clipped_to_the_norms_floor() -> None:
    """Exact diagonal 1 + 1 = 2, projections that overstate each token 1.5× (diagonal 4.5) and
    cancel exactly: the cross-term estimate −4.5 would give −2.5; the norm's floor is 0."""
    got = sequence_sq_norm(1.5 * SCORES, SQ_NORM, MASK)
    torch.testing.assert_close(got, torch.tensor([11.25 + 3.0 - 6.75, 0.0], dtype=F64))
