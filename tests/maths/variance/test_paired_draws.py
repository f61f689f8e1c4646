"""Empirical gradient variance: closed forms, paired and seeded draws, bias check, equivalent N."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
import torch
from matplotlib.figure import Figure

from otb_diag.errors import InputError
from otb_diag.maths.estimators import registry
from otb_diag.maths.estimators.registry import BASELINES, register_baseline
from otb_diag.maths.returns import outcome_token_rewards, returns_to_go
from otb_diag.maths.variance.fidelity import fidelity
from otb_diag.maths.variance.intervals import (
    bias_z,
    compare_to_mean,
    equivalent_group_size,
    trace_variance,
)
from otb_diag.maths.variance.paired_draws import (
    COLUMNS,
    BaselineSpec,
    default_specs,
    draw_estimates,
    draw_groups,
    empirical_variance,
    pool_rows,
    pool_score_means,
    usable_group_sizes,
)
from otb_diag.plots.variance import (
    fig_proxy_fidelity,
    fig_ratio_to_mean,
    fig_variance_vs_group_size,
)

F64 = torch.float64
NONE_MEAN = [BaselineSpec("none", "none"), BaselineSpec("mean", "mean")]

# Every built-in baseline, the leave-one-out variants too (not in the defaults), and the -true rows.
ALL_SPECS = default_specs(list(BASELINES), ["true"])


@pytest.fixture
def biased(monkeypatch: pytest.MonkeyPatch) -> str:
    """A deliberately biased baseline, registered for one test and unregistered after it (the
    registry is global: other tests list it)."""
    name = "test-variance-half-own-reward"
    monkeypatch.setitem(registry.BASELINES, name, None)  # teardown removes the name again
    del registry.BASELINES[name]

    @register_baseline(name, default=False)
    def half_own_reward(returns, mask, group, energy):
        """`B_i = R_i / 2` uses response i's own reward."""
        return (returns - returns[:, :1] / 2) * mask

    return name


def make_pool(prompts, size, length, dim, seed, *, reward=None, ragged=True):
    """A pool of `size` responses for each of `prompts` prompts: `(returns, mask, group, scores,
    energies)`. Outcome rewards `reward(scores) -> [B]` (default Bernoulli(1/2))."""
    gen = torch.Generator().manual_seed(seed)
    rows = prompts * size
    lengths = torch.randint(1, length + 1, (rows,), generator=gen) if ragged else length
    mask = (torch.arange(length)[None, :] < torch.as_tensor(lengths).reshape(-1, 1)).to(F64)
    mask = mask.expand(rows, length).clone()
    scores = torch.randn(rows, length, dim, generator=gen, dtype=F64) * mask[..., None]
    r = reward(scores, gen) if reward else (torch.rand(rows, generator=gen) < 0.5).to(F64)
    returns = returns_to_go(outcome_token_rewards(r, mask), mask)
    w = torch.rand(rows, length, generator=gen, dtype=F64)
    group = torch.arange(prompts).repeat_interleave(size)
    return returns, mask, group, scores, {"proxy": w, "true": w**2}


@pytest.fixture(scope="module")
def small_run():
    pool = make_pool(3, 8, 4, 3, seed=1)
    return pool, empirical_variance(*pool, specs=ALL_SPECS, draws=30, bootstrap=200, seed=7)


# ---------------------------------------------------------------------------------------------
# Variance against closed forms
# ---------------------------------------------------------------------------------------------


def test_trace_variance_is_unbiased_trace_of_covariance():
    g = np.array([[0.0, 0.0], [2.0, 0.0], [0.0, 2.0]])
    # mean (2/3, 2/3); squared deviations 8/9 + 20/9 + 20/9 = 16/3, over R - 1 = 2.
    assert trace_variance(g) == pytest.approx(8 / 3)
    assert trace_variance(g) == pytest.approx(np.var(g, axis=0, ddof=1).sum())


def test_none_matches_the_finite_population_closed_form():
    # With `none` and token-sum, g = (1/(PN)) sum_p sum_{i in S_p} x_i, x_i = sum_t G_t s_t, and
    # S_p a simple random sample of N from M: Var = (1/(PN))^2 sum_p N sigma_p^2 (M-N)/(M-1),
    # sigma_p^2 = mean_i ||x_i - xbar_p||^2 (finite-population correction, exact for the pool).
    prompts, size = 4, 40
    returns, mask, group, scores, energies = make_pool(prompts, size, 4, 3, seed=2)
    table, _ = empirical_variance(
        returns,
        mask,
        group,
        scores,
        energies,
        specs=NONE_MEAN,
        aggregations=["token-sum"],
        draws=3000,
        bootstrap=200,
        seed=0,
    )
    x = torch.einsum("bt,btk->bk", returns * mask, scores).view(prompts, size, -1).numpy()
    sigma2 = np.square(x - x.mean(1, keepdims=True)).sum(-1).mean(1)  # [P]
    for n in (2, 4, 8, 16):
        exact = (n * sigma2 * (size - n) / (size - 1)).sum() / (prompts * n) ** 2
        row = table[(table.baseline == "none") & (table.group_size == n)].iloc[0]
        assert row.variance == pytest.approx(exact, rel=0.08)


def test_mean_baseline_matches_the_gaussian_closed_form():
    # T = 1, s ~ N(0, I_k) independent of R = a + sigma*eps. Per prompt, sum_i (R_i - Rbar) s_i
    # given R has covariance sum_i (R_i - Rbar)^2 I_k, of mean (N-1) sigma^2, so with token-sum
    # Var(mean) = k sigma^2 (N-1) / (P N^2), against Var(none) = k (a^2 + sigma^2) / (P N).
    prompts, size, dim, a, sigma = 4, 1000, 4, 2.0, 1.0

    def reward(scores, gen):
        return a + sigma * torch.randn(scores.shape[0], generator=gen, dtype=F64)

    pool = make_pool(prompts, size, 1, dim, seed=3, reward=reward, ragged=False)
    table, _ = empirical_variance(
        *pool,
        specs=NONE_MEAN,
        aggregations=["token-sum"],
        group_sizes=[2, 8],
        draws=1500,
        bootstrap=200,
        seed=0,
    )
    variance = table.set_index(["baseline", "group_size"])["variance"]
    for n in (2, 8):
        assert variance["mean", n] == pytest.approx(
            dim * sigma**2 * (n - 1) / (prompts * n**2), rel=0.1
        )
        assert variance["none", n] == pytest.approx(
            dim * (a**2 + sigma**2) / (prompts * n), rel=0.1
        )


def test_bootstrap_interval_contains_the_estimate(small_run):
    _, (table, _) = small_run
    assert (table.ci_low <= table.variance).all() and (table.variance <= table.ci_high).all()
    assert (table.ci_low < table.ci_high).all()


# ---------------------------------------------------------------------------------------------
# Draws: paired, seeded, capped
# ---------------------------------------------------------------------------------------------


def test_draws_are_distinct_members_of_each_prompt_pool():
    group = torch.tensor([1, 0, 1, 0, 1, 0, 1, 0, 1, 1])
    pools = pool_rows(group)
    rows = draw_groups(pools, 2, 50, np.random.default_rng(0))
    assert rows.shape == (50, 2, 2)
    for p, pool in enumerate(pools):
        assert np.isin(rows[:, p], pool).all()
        assert (rows[:, p, 0] != rows[:, p, 1]).all()  # without replacement


def test_pool_score_means_follow_pool_order():
    group = torch.tensor([7, 3, 7])  # pools in ascending id order: 3 then 7
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0], [1.0, 0.0]])
    scores = torch.tensor([[[1.0], [3.0]], [[5.0], [99.0]], [[8.0], [99.0]]])
    means = pool_score_means(scores, mask, group)
    torch.testing.assert_close(means, torch.tensor([[5.0], [4.0]], dtype=F64))  # (1+3+8)/3
    assert [p.tolist() for p in pool_rows(group)] == [[1], [0, 2]]


def test_every_baseline_sees_the_same_draws():
    pool = make_pool(3, 8, 4, 3, seed=4)
    alias = [*NONE_MEAN, BaselineSpec("rloo", "rloo"), BaselineSpec("alias", "none")]
    table, _ = empirical_variance(*pool, specs=alias, draws=40, bootstrap=100)
    by = table.set_index(["aggregation", "baseline", "group_size"])
    # An alias of `none` on paired draws has identical estimates: zero difference, equal spread.
    assert (by.xs("alias", level=1).variance == by.xs("none", level=1).variance).all()
    assert (by.xs("alias", level=1).bias_z == 0).all()
    # Adding or removing a baseline does not move the draws of the others.
    fewer, _ = empirical_variance(*pool, specs=NONE_MEAN, draws=40, bootstrap=100)
    shared = table[table.baseline.isin(["none", "mean"])].reset_index(drop=True)
    pd.testing.assert_frame_equal(
        shared.drop(columns="equivalent_range"), fewer.drop(columns="equivalent_range")
    )


def test_same_seed_same_numbers_different_seed_different_draws(small_run):
    pool, (table, meta) = small_run
    again, meta_again = empirical_variance(*pool, specs=ALL_SPECS, draws=30, bootstrap=200, seed=7)
    pd.testing.assert_frame_equal(table, again)
    assert meta == meta_again
    other, _ = empirical_variance(*pool, specs=ALL_SPECS, draws=30, bootstrap=200, seed=8)
    assert not np.allclose(table.variance, other.variance)
    pools = pool_rows(pool[2])
    first = draw_groups(pools, 2, 30, np.random.default_rng([7, 2]))
    assert (first == draw_groups(pools, 2, 30, np.random.default_rng([7, 2]))).all()
    assert (first != draw_groups(pools, 2, 30, np.random.default_rng([8, 2]))).any()


def test_group_sizes_are_capped_at_half_the_smallest_pool():
    returns, mask, _, scores, energies = make_pool(1, 29, 3, 2, seed=5)
    group = torch.tensor([0] * 9 + [1] * 20)  # pools of 9 and 20: N <= 4
    table, meta = empirical_variance(returns, mask, group, scores, energies, draws=5, bootstrap=10)
    assert meta["group_sizes"] == [2, 4] and sorted(table.group_size.unique()) == [2, 4]
    assert (meta["pool_size_min"], meta["pool_size_max"]) == (9, 20)
    assert usable_group_sizes([2, 4, 8, 16], 16) == [2, 4, 8]
    with pytest.raises(InputError, match="half the smallest pool"):
        usable_group_sizes([4, 8], 7)


def test_constant_reward_groups_are_counted_and_carry_no_signal():
    returns, mask, group, scores, energies = make_pool(2, 10, 3, 3, seed=6)
    # Prompt 0: every reward 1; prompt 1: all rewards distinct, so no drawn group is constant.
    reward = torch.cat([torch.ones(10, dtype=F64), torch.arange(10, dtype=F64)])
    returns = returns_to_go(outcome_token_rewards(reward, mask), mask)
    table, meta = empirical_variance(returns, mask, group, scores, energies, draws=20, bootstrap=50)
    assert meta["constant_pools"] == 1
    assert (table.constant_groups == 20).all() and (table.groups == 40).all()
    assert not table.drop(columns="equivalent_range").isna().any().any()
    # Changing prompt 0's scores moves `none` but not mean or rloo: they give it zero advantage.
    specs = [*NONE_MEAN, BaselineSpec("rloo", "rloo")]
    pools = pool_rows(group)
    rows = draw_groups(pools, 4, 20, np.random.default_rng(0))
    other = scores.clone()
    other[:10] = torch.randn(10, 3, 3, dtype=F64) * mask[:10, :, None]

    def estimates(s):
        centres = pool_score_means(s, mask, group)
        return draw_estimates(returns, mask, s, energies, rows, centres, specs, ["token-mean"])

    before, after = estimates(scores), estimates(other)
    for label in ("mean", "rloo"):
        np.testing.assert_allclose(
            after["token-mean", label][0], before["token-mean", label][0], atol=1e-12
        )
    assert not np.allclose(after["token-mean", "none"][0], before["token-mean", "none"][0])


# ---------------------------------------------------------------------------------------------
# Bias check
# ---------------------------------------------------------------------------------------------


def test_bias_z_of_a_known_offset():
    rng = np.random.default_rng(0)
    noise = rng.standard_normal((400, 50))
    assert bias_z(noise) < 1.5  # about 1 without bias
    assert bias_z(noise + 0.5) > 8  # 0.5 * sqrt(400) = 10 per coordinate
    assert bias_z(np.zeros((10, 3))) == 0.0


def test_rloo_is_unbiased_and_own_reward_baseline_is_not(biased: str):
    def reward(scores, gen):  # a real signal: the reward rises along the first score direction
        signal = scores.sum(1)[:, 0]
        return 1.0 + signal + torch.randn(len(signal), generator=gen, dtype=F64)

    pool = make_pool(8, 64, 2, 4, seed=7, reward=reward, ragged=False)
    specs = [*NONE_MEAN, BaselineSpec("rloo", "rloo"), BaselineSpec("biased", biased)]
    table, _ = empirical_variance(
        *pool,
        specs=specs,
        aggregations=["token-sum"],
        group_sizes=[4],
        draws=400,
        bootstrap=100,
        seed=0,
    )
    z = table.set_index("baseline")["bias_z"]
    assert z["rloo"] < 2.5
    assert z["biased"] > 10


# ---------------------------------------------------------------------------------------------
# Equivalent group size
# ---------------------------------------------------------------------------------------------


def test_equivalent_group_size_on_a_power_law():
    sizes = [2, 4, 8, 16]
    mean = [1 / n for n in sizes]  # variance proportional to 1/N exactly
    assert equivalent_group_size(sizes, mean, 1 / 8) == pytest.approx((8.0, "within"))
    assert equivalent_group_size(sizes, mean, 1 / 6)[0] == pytest.approx(6.0)  # log-log exact
    assert equivalent_group_size(sizes, mean, 1 / 32) == (math.inf, "beyond")
    assert equivalent_group_size(sizes, mean, 1.0) == (2.0, "below")
    table = pd.DataFrame(
        [
            {"aggregation": "token-sum", "baseline": b, "group_size": n, "variance": v / n}
            for n in sizes
            for b, v in (("mean", 1.0), ("otb", 0.5))
        ]
    )
    out = compare_to_mean(table, sizes).set_index(["baseline", "group_size"])
    otb = out.loc["otb"]
    assert otb.loc[4, "equivalent_mean_group_size"] == pytest.approx(8.0)
    assert otb.loc[4, "token_savings"] == pytest.approx(0.5)
    assert otb.loc[4, "ratio_to_mean"] == pytest.approx(0.5)
    assert otb.loc[16, "equivalent_mean_group_size"] == math.inf
    assert otb.loc[16, "equivalent_range"] == "beyond"
    assert (out.loc["mean", "token_savings"] == 0).all()


# ---------------------------------------------------------------------------------------------
# Table shape, proxy fidelity, figures
# ---------------------------------------------------------------------------------------------


def test_table_columns_and_true_energy_variants(small_run):
    _, (table, meta) = small_run
    for column in COLUMNS:
        assert column in table
    assert {"otb-true", "optseq-true", "otb-loo"} <= set(table.baseline)
    assert meta["group_sizes"] == [2, 4] and meta["seed"] == 7
    assert (table[table.baseline == "mean"].ratio_to_mean == 1).all()


def test_fidelity_uses_generated_tokens_only():
    w = torch.tensor([[0.1, 0.4, 0.2], [0.3, 0.9, 5.0]], dtype=F64)
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]], dtype=F64)
    true = w**2  # monotone in w: rank correlation 1 ...
    true[1, 2] = -100.0  # ... once the masked token (an outlier) is left out
    out = fidelity(w, true, mask)
    assert out["token_spearman"] == pytest.approx(1.0) and out["tokens"] == 5
    assert out["token_pearson"] < 1.0
    assert out["sequences"] == 2
    flat = fidelity(w, torch.ones_like(w), mask)
    assert math.isnan(flat["token_spearman"])


def test_figures_draw_from_the_tables(small_run):
    _, (table, _) = small_run
    fig = fig_variance_vs_group_size(table, "token-sum", mark=("otb", 2))
    assert isinstance(fig, Figure) and len(fig.axes[0].lines) >= table.baseline.nunique()
    assert isinstance(fig_ratio_to_mean(table, "token-mean"), Figure)
    rng = np.random.default_rng(0)
    w = rng.uniform(0.01, 1.0, 500)
    tokens = pd.DataFrame({"w": w, "true_sq_norm": w * rng.lognormal(0, 0.3, 500), "mask": 1})
    fig = fig_proxy_fidelity(tokens)
    assert "Spearman" in fig.axes[0].get_title()
