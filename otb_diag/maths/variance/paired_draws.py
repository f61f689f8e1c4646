"""Empirical variance of the policy-gradient estimator under each baseline (docs/theory.md §4).

From a pool of M responses per prompt, draw R groups of N responses per prompt without
replacement, and for every draw r build the estimate

    g_r = sum_i sum_t c_{i,t} A^b_{i,t} s_{i,t}        (one vector in R^k)

with `A^b` the advantages of baseline b computed on the drawn sub-batch only (the group baseline
sees only the N drawn members), `c = aggregation_weights(agg, mask_of_subbatch)` and `s` the
per-token projected score vectors. Every baseline and aggregation sees the *same* draws (paired),
so differences between baselines are not draw noise.

Definitions (one row of the table per aggregation, baseline and N):
- `variance = sum_r ||g_r - mean_r g||^2 / (R - 1)`: the trace of the sample covariance of the
  draws, normalised by R - 1 (unbiased). `ci_low, ci_high`: percentile bootstrap interval over
  draws (resampling draws with replacement; the same resamples for every baseline at one N).
- `ratio_to_mean`: variance / variance of the baseline labelled `mean` (same aggregation, same N).
- `bias_z`: paired differences `d_r = g_{b,r} - g_{none,r}`, with the scores centred on each
  prompt's pool mean (`pool_score_means`); per coordinate j the z-score
  `z_j = mean_r d_rj / (std_r d_rj / sqrt(R))` (std with R - 1); `bias_z = sqrt(mean_j z_j^2)`,
  the root-mean-square z over the k coordinates. It is about 1 when b does not change the mean
  over draws and grows like sqrt(R) when it does; it measures significance, not size.
  Why centre: under the policy `E[s_t] = 0`, but a pool's mean score is not 0, so with raw
  scores any baseline near the mean reward `Rbar` shifts the mean over draws by about
  `-Rbar * pool mean score`, which shows as z ~ sqrt(N R / M) even for `rloo`. Centring removes
  that pool noise (d is linear in s), not a real bias: a baseline using response i's own reward
  still correlates with its centred score. What is left for `rloo` is the without-replacement
  term, a relative -1/(M - 1) of the signal.
- `equivalent_mean_group_size` N': where the `mean` baseline's variance curve (log-log linear
  interpolation over the measured N) first comes down to this baseline's variance at N, and
  `token_savings = 1 - N / N'`. `equivalent_range` says how to read them:
    "within": interpolated inside the measured N;
    "beyond": the mean curve never gets that low: N' = inf (> max N), and `token_savings` is the
              lower bound 1 - N / max N;
    "below":  the mean curve is already lower at the smallest N: N' is reported as min N (an
              upper bound), and `token_savings` = 1 - N / min N is an upper bound.
- `constant_groups`: drawn groups (of the R * P) whose returns are all equal: they carry no
  signal under group baselines (mean and rloo give them exactly zero advantage).

The `grpo` baseline rescales advantages by the group std, so its variance (and bias against
`none`) is on another scale; compare it with care (docs/theory.md §3).
All arithmetic is float64 on the device of the inputs; results are deterministic given `seed`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any, NamedTuple

import numpy as np
import pandas as pd
import torch
from torch import Tensor

from otb_diag.errors import InputError
from otb_diag.maths.aggregation import aggregation_weights, default_aggregations
from otb_diag.maths.energy.token_stats import cumulative_energy
from otb_diag.maths.estimators.advantages import Estimator, token_advantages
from otb_diag.maths.estimators.registry import baseline_names, get_baseline
from otb_diag.maths.variance.intervals import (
    REFERENCE,
    bias_z,
    bootstrap_counts,
    bootstrap_interval,
    compare_to_mean,
    trace_variance,
)

PROXY = "proxy"  # energy source: the logit-gradient proxy w_t
DEFAULT_AGGREGATIONS = default_aggregations()
DEFAULT_GROUP_SIZES = (2, 4, 8, 16, 32, 64)  # capped at M/2 by `usable_group_sizes`
UNBIASED_REFERENCE = "none"
# variance.csv's documented columns, in order (extra columns follow them).
COLUMNS = [
    "mode", "aggregation", "baseline", "group_size", "variance", "ci_low", "ci_high",
    "ratio_to_mean", "bias_z", "equivalent_mean_group_size", "token_savings",
]  # fmt: skip


NO_ZERO_TAIL = "otb-no-zero-tail"  # OTB without verl's zero tail, beside `otb` (zero_tail.py)


@dataclass(frozen=True)
class BaselineSpec:
    """One baseline row of the table: registry baseline `name`, fed the per-token energy source
    `energy` (a key of the `energies` mapping, None for baselines that use no energy), with
    verl's zero tail as the run's estimator has it (`handle_zero_tail` None) or as given."""

    label: str
    name: str
    energy: str | None = None
    handle_zero_tail: bool | None = None


def default_specs(
    baselines: Sequence[str] | None = None,
    extra_sources: Sequence[str] = (),
    zero_tail_split: bool = False,
) -> list[BaselineSpec]:
    """`baselines` (default: the registry's defaults) on the proxy energy when their registry
    entry `needs_energy`, plus `<name>-<src>` for each extra energy source (the registry's
    `TRUE_ENERGIES`: "true", the per-token `‖s_t‖²`; "seqnorm-true", the sequence's
    `‖Σ_t s_t‖²`) of those whose entry lists it in `true_energies`, plus, with
    `zero_tail_split` and `otb` among them, `NO_ZERO_TAIL`: OTB without verl's zero tail."""
    names = baseline_names(defaults_only=True) if baselines is None else baselines
    entries = [get_baseline(n) for n in names]
    specs = [BaselineSpec(b.name, b.name, PROXY if b.needs_energy else None) for b in entries]
    for source in extra_sources:
        specs += [
            BaselineSpec(f"{b.name}-{source}", b.name, source)
            for b in entries
            if source in b.true_energies
        ]
    if zero_tail_split and "otb" in names:
        specs.append(BaselineSpec(NO_ZERO_TAIL, "otb", PROXY, handle_zero_tail=False))
    return specs


# ---------------------------------------------------------------------------------------------
# Draws
# ---------------------------------------------------------------------------------------------


def pool_rows(group: Tensor) -> list[np.ndarray]:
    """Row indices of each prompt's pool, for the group ids present in `group: [B]`, in id order."""
    ids = group.cpu().numpy()
    order = np.argsort(ids, kind="stable")
    _, starts = np.unique(ids[order], return_index=True)
    return np.split(order, starts[1:])


def usable_group_sizes(group_sizes: Sequence[int], smallest_pool: int) -> list[int]:
    """The requested N that are at most M/2 (M the smallest pool), so draws stay varied."""
    sizes = sorted({int(n) for n in group_sizes if 1 <= n <= smallest_pool // 2})
    if not sizes:
        raise InputError(
            f"no group size in {list(group_sizes)} is at most half the smallest pool "
            f"({smallest_pool} responses)",
            field="group_sizes",
            hint="Sample more responses per prompt or ask for smaller groups.",
        )
    return sizes


def draw_groups(
    pools: Sequence[np.ndarray], n: int, draws: int, rng: np.random.Generator
) -> np.ndarray:
    """`[R, P, N]` pool-row indices: for every draw and prompt, N distinct rows of its pool."""
    rows = np.empty((draws, len(pools), n), dtype=np.int64)
    for p, pool in enumerate(pools):
        # The ranks of iid uniforms are a uniform random permutation: its first N are a sample
        # without replacement, drawn for all R draws at once.
        rows[:, p] = pool[rng.random((draws, len(pool))).argsort(axis=1)[:, :n]]
    return rows


# ---------------------------------------------------------------------------------------------
# Per-draw estimates
# ---------------------------------------------------------------------------------------------


def pool_score_means(scores: Tensor, mask: Tensor, group: Tensor) -> Tensor:
    """`[P, k]`: each prompt's mean score over the generated tokens of its whole pool, in the
    order of `pool_rows` (ascending group id).

    scores: `[B, T, k]`, mask: `[B, T]`, group: `[B]`. Under the policy `E[s_t] = 0`; a finite
    pool's mean is sampling noise, which `bias_z` removes (see `draw_estimates`).
    """
    pool = torch.unique(group, return_inverse=True)[1]  # [B]: index of the row's pool
    mask = mask.double()
    totals = torch.einsum("btk,bt->bk", scores.double(), mask)  # sum_t m_t s_t per row
    sums = totals.new_zeros(int(pool.max()) + 1, totals.shape[1]).index_add_(0, pool, totals)
    tokens = mask.new_zeros(len(sums)).index_add_(0, pool, mask.sum(-1))
    return sums / tokens.clamp_min(1)[:, None]


class DrawSet(NamedTuple):
    """One (aggregation, baseline)'s estimates on the paired draws.

    g, g_centred: `[R, k]` per draw (see `draw_estimates`); prompt_sums, prompt_squares:
    `[P, k]` sums over draws of each prompt's own estimate `ĝ_{r,p} = P · g_{r,p}` (its share
    of `g_r = (1/P) Σ_p ĝ_{r,p}`) and of its squares, coordinate by coordinate: the moments
    `noise_scale.py` splits the variance with, between prompts and within them."""

    g: np.ndarray
    g_centred: np.ndarray
    prompt_sums: np.ndarray
    prompt_squares: np.ndarray


def _pool_layout(rows: np.ndarray, pad: int) -> np.ndarray:
    """`[P, M_max]` pool rows each prompt's draws use (`rows: [R, P, N]`), padded with `pad`."""
    used = [np.unique(rows[:, p]) for p in range(rows.shape[1])]
    layout = np.full((len(used), max(len(u) for u in used)), pad, dtype=np.int64)
    for p, u in enumerate(used):
        layout[p, : len(u)] = u
    return layout


def draw_estimates(
    returns: Tensor,
    mask: Tensor,
    scores: Tensor,
    energies: Mapping[str, Tensor],
    rows: np.ndarray,
    centres: Tensor,
    specs: Sequence[BaselineSpec],
    aggregations: Sequence[str],
    *,
    is_weights: Tensor | None = None,
    estimator: Estimator = Estimator(tir=False),
    max_elements: int = 2**24,
) -> dict[tuple[str, str], DrawSet]:
    """`g_r` of every draw for every (aggregation, baseline label), all on the same draws.

    returns, mask: `[B, T]` pool tensors; scores: `[B, T, k]`; energies: source -> per-token
    `w: [B, T]` (accumulated to `W_t` here) or a per-response energy `[B]` (taken as it is,
    any importance weights already in it, so the baseline is given no ρ); rows: `[R, P, N]`
    from `draw_groups`; centres: `[P, k]` from `pool_score_means`; is_weights: `[B, T]` ρ of
    the pool or None. Each draw's advantages come from the one estimator (`token_advantages`)
    on the drawn rows alone, under `estimator` (decided for the pool: `Estimator.resolved`),
    exactly as `energy` computes them on a whole batch.
    Returns (aggregation, label) -> `DrawSet`, whose `g_centred` uses the scores
    `s_t - centres[p]` on prompt p's generated tokens. By linearity
    `g_centred_r = g_r - sum_p a_rp centres[p]` with `a_rp = sum_{i in p, t} c_it A_it`.
    Draws are processed in chunks of C so that the `[C, B, T]` coefficients stay within
    `max_elements`.
    """
    draws, prompts, n = rows.shape
    b, t, k = scores.shape
    returns, mask, centres = returns.double(), mask.double(), centres.double()
    # Scores laid out pool by pool ([P, M_max * T, k], a zero row as padding), so that each
    # prompt's share g_{r,p} = sum_{i in p, t} c_it A_it s_it is one batched matmul.
    layout = torch.as_tensor(_pool_layout(rows, pad=b), device=mask.device)  # [P, M_max]
    # One float64 copy of the scores, gathered pool by pool; padding slots gather row 0 and are
    # zeroed (their coefficients are 0 anyway).
    pool_scores = scores[layout.clamp(max=b - 1).reshape(-1)].double()  # [P*M_max, T, k]
    pool_scores[layout.reshape(-1) == b] = 0.0
    pool_scores = pool_scores.view(prompts, -1, k)  # [P, M_max * T, k]
    # W_t of every per-token source over whole pool rows (row-wise, so indexing a draw's rows
    # after the cumsum gives the same numbers as accumulating them per draw); per-row ones as is.
    cumulative = {
        src: cumulative_energy(w.double(), mask) if w.dim() == 2 else w.double()
        for src, w in energies.items()
    }
    is_weights = None if is_weights is None else is_weights.double()
    chunk = max(1, max_elements // max(b * t, 1))
    raw = {(agg, spec.label): np.empty((draws, k)) for agg in aggregations for spec in specs}
    centred = {key: np.empty((draws, k)) for key in raw}
    sums = {key: np.zeros((prompts, k)) for key in raw}
    squares = {key: np.zeros((prompts, k)) for key in raw}
    for lo in range(0, draws, chunk):
        c = min(chunk, draws - lo)
        sub = torch.as_tensor(rows[lo : lo + c].reshape(-1), device=mask.device)  # [C*P*N]
        # All C draws form one batch of C*P groups: group ids are unique per (draw, prompt).
        group = torch.arange(c * prompts, device=mask.device).repeat_interleave(n)
        draw = torch.arange(c, device=mask.device).repeat_interleave(prompts * n)
        sub_mask = mask[sub]
        # c_{i,t} is normalised over each draw's own batch of P*N responses.
        weights = {
            agg: torch.cat([aggregation_weights(agg, m) for m in sub_mask.view(c, -1, t)])
            for agg in aggregations
        }
        for spec in specs:
            energy = cumulative[spec.energy][sub] if spec.energy else None
            per_row = energy is not None and energy.dim() == 1  # ρ already in it
            rho = None if is_weights is None or per_row else is_weights[sub]
            tail = spec.handle_zero_tail
            own = estimator if tail is None else replace(estimator, handle_zero_tail=tail)
            adv = token_advantages(
                spec.name, returns[sub], sub_mask, group, energy, is_weights=rho, estimator=own,
            )  # fmt: skip
            for agg, weight in weights.items():
                key = (agg, spec.label)
                # Scatter c*A back onto the pool (a row appears at most once per draw; row b is
                # the padding), then gather it pool by pool: never a [C, P*N, T, k].
                coef = returns.new_zeros(c, b + 1, t)
                coef[draw, sub] = weight * adv
                pool_coef = coef[:, layout.reshape(-1)].view(c, prompts, -1)  # [C, P, M_max*T]
                shares = torch.einsum("cpn,pnk->cpk", pool_coef, pool_scores)  # g_{r,p}
                g = shares.sum(1)  # g_r = sum_p g_{r,p}
                mass = (weight * adv).sum(-1).view(c, prompts, n).sum(-1)  # a_rp: [C, P]
                per_prompt = (prompts * shares).cpu().numpy()  # ĝ_{r,p} = P g_{r,p}
                raw[key][lo : lo + c] = g.cpu().numpy()
                centred[key][lo : lo + c] = (g - mass @ centres).cpu().numpy()
                sums[key] += per_prompt.sum(0)
                squares[key] += np.square(per_prompt).sum(0)
    return {key: DrawSet(raw[key], centred[key], sums[key], squares[key]) for key in raw}


# ---------------------------------------------------------------------------------------------
# The whole measurement
# ---------------------------------------------------------------------------------------------


def _summary(
    g: np.ndarray, g_centred: np.ndarray, none_centred: np.ndarray, counts: np.ndarray
) -> dict[str, float]:
    """variance, ci_low, ci_high and bias_z of one baseline's draws (see the module docstring)."""
    low, high = bootstrap_interval(g, counts)
    return {
        "variance": trace_variance(g),
        "ci_low": low,
        "ci_high": high,
        "bias_z": bias_z(g_centred - none_centred),
    }


def _check(specs: Sequence[BaselineSpec], energies: Mapping[str, Tensor], draws: int) -> None:
    labels = [s.label for s in specs]
    if len(set(labels)) != len(labels):
        raise InputError(f"baseline labels must be unique, got {labels}", field="baselines")
    for needed in (REFERENCE, UNBIASED_REFERENCE):
        if needed not in labels:
            raise InputError(f"the baselines must include '{needed}'", field="baselines")
    unfed = [s.label for s in specs if s.energy is None and get_baseline(s.name).needs_energy]
    if unfed:
        raise InputError(f"baselines {unfed} need an energy source", field="baselines")
    missing = sorted({s.energy for s in specs if s.energy and s.energy not in energies})
    if missing:
        raise InputError(f"no energy source {missing}; given {sorted(energies)}", field="energy")
    if draws < 2:
        raise InputError(f"need at least 2 draws for a variance, got {draws}", field="draws")


@dataclass(frozen=True)
class PairedDraws:
    """The draws of every N with their estimates, ready for `variance_table`.

    per_size: N -> (`draw_estimates`' output, bootstrap counts `[S, R]`, constant groups);
    pool_sizes: `[P]` responses in each prompt's pool (ascending group id, as the draws).
    """

    per_size: dict[int, tuple[dict[tuple[str, str], DrawSet], np.ndarray, int]]
    specs: list[BaselineSpec]
    aggregations: list[str]
    sizes: list[int]
    draws: int
    prompts: int
    metadata: dict[str, Any]
    pool_sizes: np.ndarray


def paired_estimates(
    returns: Tensor,
    mask: Tensor,
    group: Tensor,
    scores: Tensor,
    energies: Mapping[str, Tensor],
    *,
    specs: Sequence[BaselineSpec] | None = None,
    aggregations: Sequence[str] = DEFAULT_AGGREGATIONS,
    group_sizes: Sequence[int] = DEFAULT_GROUP_SIZES,
    draws: int = 200,
    bootstrap: int = 1000,
    seed: int = 0,
    mode: str = PROXY,
    is_weights: Tensor | None = None,
    estimator: Estimator = Estimator(),
    max_elements: int = 2**24,
) -> PairedDraws:
    """The paired draws and estimates `g_r` of every baseline and N (arguments as
    `empirical_variance`), from which `variance_table` reads any subset of coordinates."""
    specs = list(specs or default_specs(extra_sources=[s for s in energies if s != PROXY]))
    _check(specs, energies, draws)
    estimator = estimator.resolved(mask, None)
    pools = pool_rows(group)
    pool_sizes = [len(p) for p in pools]
    sizes = usable_group_sizes(group_sizes, min(pool_sizes))
    centres = pool_score_means(scores, mask, group)
    sequence_return = returns[:, 0].cpu().numpy()  # R_i = G_0, what the group baselines centre
    per_size = {}
    for n in sizes:
        rows = draw_groups(pools, n, draws, np.random.default_rng([seed, n]))
        per_size[n] = (
            draw_estimates(
                returns, mask, scores, energies, rows, centres, specs, aggregations,
                is_weights=is_weights, estimator=estimator, max_elements=max_elements,
            ),
            bootstrap_counts(draws, bootstrap, np.random.default_rng([seed, n, 1])),
            int((np.ptp(sequence_return[rows], axis=-1) == 0).sum()),
        )  # fmt: skip
    metadata = {
        "mode": mode,
        "seed": seed,
        "draws": draws,
        "bootstrap": bootstrap,
        "group_sizes": sizes,
        "prompts": len(pools),
        "pool_size_min": min(pool_sizes),
        "pool_size_max": max(pool_sizes),
        "constant_pools": int(sum(np.ptp(sequence_return[p]) == 0 for p in pools)),
        "aggregations": list(aggregations),
        "specs": [asdict(s) for s in specs],
        "score_dim": int(scores.shape[-1]),
        "variance": "trace of the sample covariance over draws, 1/(R-1)",
    }
    return PairedDraws(
        per_size, specs, list(aggregations), sizes, draws, len(pools), metadata,
        np.asarray(pool_sizes),
    )  # fmt: skip


def variance_table(
    paired: PairedDraws, coordinates: slice | np.ndarray = slice(None)
) -> pd.DataFrame:
    """The table of `empirical_variance` over the score `coordinates` only (default all).

    The trace is additive over coordinates: for a partition into blocks (block-diagonal
    projection, docs/theory.md §4) the blocks' variances sum to the total, draw by draw.
    """
    records = []
    for agg in paired.aggregations:
        for spec in paired.specs:
            for n, (estimates, counts, constant) in paired.per_size.items():
                drawn = estimates[agg, spec.label]
                g, centred = drawn.g[:, coordinates], drawn.g_centred[:, coordinates]
                none_centred = estimates[agg, UNBIASED_REFERENCE].g_centred[:, coordinates]
                records.append(
                    {
                        "mode": paired.metadata["mode"],
                        "aggregation": agg,
                        "baseline": spec.label,
                        "group_size": n,
                        **_summary(g, centred, none_centred, counts),
                        "draws": paired.draws,
                        "groups": paired.draws * paired.prompts,
                        "constant_groups": constant,
                    }
                )
    table = compare_to_mean(pd.DataFrame(records), paired.sizes)
    return table[[*COLUMNS, *(c for c in table.columns if c not in COLUMNS)]]


def empirical_variance(
    returns: Tensor,
    mask: Tensor,
    group: Tensor,
    scores: Tensor,
    energies: Mapping[str, Tensor],
    **options: Any,
) -> tuple[pd.DataFrame, dict[str, Any]]:
    """Variance, bootstrap interval, bias check and equivalent group size of every baseline.

    returns: `[B, T]` reward-to-go `G_t` of the pool (`returns_to_go`); mask: `[B, T]`;
    group: `[B]` prompt ids; scores: `[B, T, k]` projected per-token scores;
    energies: source -> per-token energy `w: [B, T]` (`"proxy"`, and e.g. `"true"`) or
    per-response energy `[B]` (e.g. `"seqnorm-true"`, see `draw_estimates`).
    options (keyword only): specs (default `default_specs` of the extra energy sources),
    aggregations, group_sizes, draws (200), bootstrap (1000), seed (0), mode (only recorded),
    is_weights, estimator, max_elements (see `paired_estimates`). N runs over `group_sizes` capped
    at M/2 (M the smallest pool); the draws of one N come from `default_rng([seed, N])` and their
    bootstrap resamples from `default_rng([seed, N, 1])`, so N's numbers do not depend on the
    other sizes asked for.

    Returns the table (columns in the module docstring, plus draws, groups, constant_groups,
    equivalent_range) and metadata (seed, draws, sizes, pool counts, specs).
    """
    paired = paired_estimates(returns, mask, group, scores, energies, **options)
    return variance_table(paired), paired.metadata
