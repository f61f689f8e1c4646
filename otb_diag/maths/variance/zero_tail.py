"""What verl's zero tail does to OTB's gradient estimate, measured on the paired draws
(docs/theory.md §3.1, "What the tail does to the variance").

`variance-compare` with `zero_tail_split` measures `otb` and the same OTB without the tail
(`NO_ZERO_TAIL`, `BaselineSpec.handle_zero_tail = False`) on the same draws, so the tail's part
of draw r's estimate is the paired difference

    d_r = g_r(otb) − g_r(otb without the tail)   [R, k]

the sum, over the tail tokens of each drawn group's strictly longest member, of
`c_t (A_t^with − A_t^without) s_t ≈ c_t G_t s_t`. Its variance (over draws, `tail_variance`) is
what the tail adds. Its mean says whether it also moves the expected update. The draws of one
prompt share that prompt's finite pool, so their mean carries the pool's own noise; the prompts
are independent, so the mean is judged across them: with `m_p` prompt p's share of d averaged
over the draws (`[P, k]`, from `DrawSet.prompt_sums`), `‖E d‖²` is estimated without bias as
`‖m̄‖² − tr Cov_p(m) / P`, with a percentile bootstrap interval over the prompts. An interval that
holds 0 reads "mean zero within the prompts' noise"; one above 0, "a mean of its own": the tail
then raises, on average, the probability of the tokens that carry the longest member past the
second-longest, a push toward longer answers where `G > 0`.
"""

from __future__ import annotations

import numpy as np

from otb_diag.maths.variance.intervals import (
    bias_z,
    bootstrap_counts,
    percentile_interval,
    resampled_moments,
    trace_variance,
)
from otb_diag.maths.variance.paired_draws import NO_ZERO_TAIL, PairedDraws

OTB = "otb"


def tail_mean_square(m: np.ndarray) -> float:
    """`‖E m‖²` without bias from independent rows `m: [n, k]`: `‖m̄‖² − tr Cov(m) / n`."""
    return float(np.square(m.mean(0)).sum() - trace_variance(m) / len(m))


def zero_tail_rows(
    paired: PairedDraws, aggregation: str, resamples: int = 1000
) -> list[dict[str, float | int | bool]]:
    """One row per N: OTB's variance with and without the zero tail, the tail part's variance
    over draws, `‖E d‖²` across prompts with its 95 % interval (`resamples` bootstrap resamples
    of the prompts, seeded by the draws' seed), its z (`bias_z` over prompts) and whether the
    interval holds 0 (`mean_zero`). Needs `otb` and `NO_ZERO_TAIL` among the draws' baselines
    and at least 2 prompts."""
    rows = []
    for n, (estimates, _, _) in paired.per_size.items():
        with_tail, without = estimates[aggregation, OTB], estimates[aggregation, NO_ZERO_TAIL]
        shares = (with_tail.prompt_sums - without.prompt_sums) / paired.draws  # m_p: [P, k]
        counts = bootstrap_counts(
            len(shares), resamples, np.random.default_rng([paired.metadata["seed"], n, 2])
        )
        means, variances = resampled_moments(shares, counts)
        low, high = percentile_interval(np.square(means).sum(1) - variances / len(shares))
        rows.append(
            {
                "group_size": n,
                "otb_variance": trace_variance(with_tail.g),
                "no_zero_tail_variance": trace_variance(without.g),
                "tail_variance": trace_variance(with_tail.g - without.g),
                "tail_mean_square": tail_mean_square(shares),
                "tail_mean_square_low": low,
                "tail_mean_square_high": high,
                "tail_bias_z": bias_z(shares),
                "mean_zero": bool(low <= 0.0),
            }
        )
    return rows
