"""The noise scale pooled over training steps (docs/theory.md §4.1; McCandlish et al. 2018,
appendix A): one step's split (`step_split.py`) rests on its few prompts, a run's steps on
thousands.

Each split step s gives unbiased estimates `t_s = tr Σ` (`total`), `g_s = |G|²` and, where the
split is known, `w_s` (`within`), with its prompts `P_s`, group size `N_s` and mean response
tokens `L_s`. Steps draw fresh prompts, so they are the samples. With weights `ω_s` (1 over the
last K steps: `WindowPool`; `β^(S−s)` over all: `EmaPool`, McCandlish's moving averages):

    x̄       = Σ ω x / Σ ω                        every column of the step tuple
    n_eff   = (Σ ω)² / Σ ω²                       K for the window, (1+β)/(1−β) for a long EMA
    C_xy    = Σ ω (x − x̄)(y − ȳ) / (Σ ω − Σ ω²/Σ ω)    unbiased with these weights
    B       = t̄ / ḡ                               ratio of means: a mean of per-step ratios
                                                   diverges where a step's g_s is near 0
    ḡ       ± q · √(C_gg / n_eff)                 q = t_{0.975, n_eff − 1}
    r = 1/B = ḡ / t̄,  se_r² = (C_gg − 2 r C_gt + r² C_tt) / (n_eff t̄²)     (delta method)
    B ∈ [1 / (r + q se_r), 1 / (r − q se_r)]      open above (inf) where r − q se_r ≤ 0
    within share = w̄ / t̄, its se the same delta method, both clipped to [0, 1] (`unit_share`)
    SNR(P̄) = P̄ / B;  knee B·N̄, B·N̄·L̄

`B`'s interval is the inverse of `1/B`'s, as `noise_scale.noise_estimates` takes it: `1/B`
stays finite where `|G|²` crosses 0. `|G|²` is resolved when its interval lies above 0; until
then no knee is claimed, only its lower end ("at least X prompts"). Nor is one claimed where
t̄ ≤ 0, which a two-batch tr Σ can pool to (`two_batch.py`): B ≤ 0 is no knee.

Drift: the policy changes, so the pooled `B` is that of the pooled terms, `mean tr Σ / mean
|G|²` over the window (or EMA-weighted), not the current step's; a trend shows as a lag of about
K/2 steps (window) or β/(1−β) steps (EMA), and the interval is that of the pooled quantity.
The state is a fixed handful of numbers: the window keeps K step tuples, the EMA its moments.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, fields

import numpy as np
from scipy import stats

from otb_diag.maths.noise.noise_scale import LEVEL, signal_and_noise

# One step's tuple, in order: tr Σ, |G|², within (NaN where the split is unknown), P, N, L̄.
COLUMNS = ("total", "grad_sq", "within", "prompts", "group_size", "mean_tokens")
_T, _G, _W, _P, _N, _L = range(len(COLUMNS))


@dataclass(frozen=True)
class Moments:
    """Weighted moments of the step tuples: `weight = Σ ω`, `weight_sq = Σ ω²`, `mean` `[6]`
    the weighted means of `COLUMNS`, `comoment` `[6, 6]` `Σ ω (x − x̄)(y − ȳ)`."""

    weight: float
    weight_sq: float
    mean: np.ndarray
    comoment: np.ndarray
    steps: int  # steps pooled (all steps for the EMA, whatever their weight)


def moments_of(rows: np.ndarray) -> Moments:
    """`Moments` of `rows` `[S, 6]` with weight 1 each (two passes: no cancellation)."""
    mean = rows.mean(0)
    centred = rows - mean
    s = len(rows)
    return Moments(float(s), float(s), mean, centred.T @ centred, s)


def ema_step(m: Moments | None, row: np.ndarray, decay: float) -> Moments:
    """`m` decayed by β = `decay`, then `row` `[6]` added with weight 1 (West's weighted
    update: the means move by `δ / Σω`, the comoment by `δ ⊗ (x − x̄_new)`, no cancellation)."""
    if m is None:
        return Moments(1.0, 1.0, row.copy(), np.zeros((len(row), len(row))), 1)
    weight = decay * m.weight + 1.0
    delta = row - m.mean
    mean = m.mean + delta / weight
    comoment = decay * m.comoment + np.outer(delta, row - mean)
    return Moments(weight, decay**2 * m.weight_sq + 1.0, mean, comoment, m.steps + 1)


@dataclass(frozen=True)
class Pooled:
    """The pooled answer of one (baseline, aggregation) stream, each estimate with its 95 %
    interval (`_low`, `_high`); NaN where undefined (a within share without the split)."""

    steps: int  # split steps pooled
    effective_steps: float  # n_eff: the steps' worth of samples (the EMA's weights discount)
    prompts: float  # prompts pooled: n_eff · P̄
    prompts_per_step: float  # P̄, the run's P
    group_size: float  # N̄
    mean_tokens: float  # L̄, mean response tokens
    total: float  # mean tr Σ
    grad_sq: float
    grad_sq_low: float
    grad_sq_high: float
    within_share: float
    within_share_low: float
    within_share_high: float
    noise_scale: float  # B, the knee in prompts per step (inf: no signal resolved)
    noise_scale_low: float
    noise_scale_high: float
    snr: float  # at P̄
    snr_low: float
    snr_high: float
    knee_responses: float  # B · N̄
    knee_responses_low: float
    knee_responses_high: float
    knee_tokens: float  # B · N̄ · L̄, tokens a step at the knee
    knee_tokens_low: float
    knee_tokens_high: float

    @property
    def resolved(self) -> bool:
        """`|G|²`'s interval lies above 0 and the pooled tr Σ is above 0: a knee B = t̄ / ḡ > 0
        is claimed (a split's tr Σ is a sample variance, ≥ 0; the two-batch estimate's is a
        difference of squares and may pool to ≤ 0, where B is no knee)."""
        return self.grad_sq_low > 0 and self.total > 0

    def metrics(self) -> dict[str, float]:
        """Every field as a float, and `resolved` as 1 or 0 (the names logged under
        `otb/budget/<name>/<pool>/`)."""
        out = {f.name: float(getattr(self, f.name)) for f in fields(self)}
        return out | {"resolved": float(self.resolved)}

    def sentence(self, estimator: str, step: int, per_update: float | None = None) -> str:
        """The pooled answer at split step `step`: "at step S, the knee is ~B prompts [lo, hi]
        under <estimator> at N; you train with P prompts a step", or the honest bound while
        `|G|²` or tr Σ is not resolved. `per_update`: the prompts an optimizer update took
        where a knee controller accumulated several steps (P a step is then what one
        generation batch sampled)."""
        n = _count(self.group_size)
        run = f"you train with {_count(self.prompts_per_step)} prompts a step"
        if per_update is not None and per_update != self.prompts_per_step:
            run = (
                f"you sample {_count(self.prompts_per_step)} prompts a step and update with "
                f"{_count(per_update)} (the knee controller)"
            )
        if self.resolved:
            return (
                f"at step {step}, the knee is ~{self.noise_scale:.3g} prompts "
                f"[{self.noise_scale_low:.3g}, {_end(self.noise_scale_high)}] under {estimator} "
                f"at N = {n} ({self.knee_tokens / 1e3:.3g} k tokens a step); {run}"
            )
        if self.total < 0:  # a two-batch tr Σ pooled below 0: B = t̄ / ḡ bounds nothing
            return (
                f"at step {step}, under {estimator} at N = {n}, the pooled tr Σ is "
                f"{self.total:.3g} after {self.steps} steps ({self.prompts:.0f} prompts): no "
                f"noise measured, so no knee and no bound; {run}"
            )
        if math.isinf(self.noise_scale_low):  # 1/B's whole interval ≤ 0
            bound = "no signal measurable at all (|G|² ≤ 0 across its interval)"
        elif self.noise_scale_low > 0:
            bound = f"the knee is at least {self.noise_scale_low:.3g} prompts"
        else:  # one step: no interval yet
            bound = "no bound on the knee yet"
        return (
            f"at step {step}, under {estimator} at N = {n}, |G|² is not resolved after "
            f"{self.steps} steps ({self.prompts:.0f} prompts); {bound}; {run}"
        )


def _count(x: float) -> str:
    return f"{x:.0f}" if math.isfinite(x) and x == round(x) else f"{x:.3g}"


def _end(x: float) -> str:
    return "∞" if math.isinf(x) else f"{x:.3g}"


def pooled_estimates(m: Moments) -> Pooled:
    """The estimates of the module docstring from the moments of the pooled steps."""
    n_eff = m.weight**2 / m.weight_sq
    x = m.mean
    with np.errstate(divide="ignore", invalid="ignore"):
        cov = m.comoment / (m.weight - m.weight_sq / m.weight)  # C, [6, 6]
        q = float(stats.t.ppf(0.5 + LEVEL / 2, n_eff - 1)) if n_eff > 1 else math.nan
    known = not math.isnan(x[_W])  # a stream of total and |G|² only has no within share
    point = signal_and_noise(
        *(np.array([v]) for v in ((x[_W], x[_T] - x[_W]) if known else (0.0, x[_T]))),
        np.array([x[_G]]),
        x[_P],
    )
    grad_ends = _ends(x[_G], q * _se(cov, n_eff, _G, _G, 0.0))
    inv = float(point["inverse_noise_scale"][0])
    inv_low, inv_high = _ends(inv, q * _ratio_se(cov, n_eff, x, _G, inv))
    b = float(point["noise_scale"][0])
    b_low = 1 / inv_high if inv_high > 0 else math.inf
    b_high = 1 / inv_low if inv_low > 0 else math.inf
    if not math.isnan(b):  # the two forms of B differ by an ulp at se = 0: hold the estimate
        b_low, b_high = min(b_low, b), max(b_high, b)
    raw_share = float(point["within_share"][0]) if known else math.nan
    share, *share_ends = unit_share(
        raw_share, *_ends(raw_share, q * _ratio_se(cov, n_eff, x, _W, raw_share))
    )
    tokens = x[_N] * x[_L]  # a response's tokens times N: B · N̄ · L̄
    return Pooled(
        steps=m.steps,
        effective_steps=n_eff,
        prompts=n_eff * x[_P],
        prompts_per_step=x[_P],
        group_size=x[_N],
        mean_tokens=x[_L],
        total=x[_T],
        grad_sq=x[_G],
        grad_sq_low=grad_ends[0],
        grad_sq_high=grad_ends[1],
        within_share=share,
        within_share_low=share_ends[0],
        within_share_high=share_ends[1],
        noise_scale=b,
        noise_scale_low=b_low,
        noise_scale_high=b_high,
        snr=float(point["snr"][0]),
        snr_low=x[_P] * inv_low,
        snr_high=x[_P] * inv_high,
        knee_responses=b * x[_N],
        knee_responses_low=b_low * x[_N],
        knee_responses_high=b_high * x[_N],
        knee_tokens=b * tokens,
        knee_tokens_low=b_low * tokens,
        knee_tokens_high=b_high * tokens,
    )


def unit_share(*values: float) -> tuple[float, ...]:
    """A pooled within share and its interval's ends, each clipped to [0, 1] (NaN stays NaN).

    The share's truth lies there: within and between are variances, so within / (within +
    between) is in [0, 1]. Its estimate w̄ / t̄ need not be: t̄ pools `S_m`, the spread of the
    prompts' means, which holds the within noise besides the between-prompt spread, and where
    that spread is small next to the noise a sample of it falls below the within term (the
    unbiased between-prompt estimate `S_m − within` below 0): on the toy run the pooled share
    read 1.012. Clipping a point onto an interval that holds the truth never moves it away
    from the truth, and an interval that held the truth still holds it, so the 95 % stands; a
    share of 1 reads "no between-prompt spread measurable". The per-step share
    (`split/<name>/within_share`, `step_split.py`) is logged unclipped, w / t as estimated, so
    that the steps' values average without the clip's bias."""
    return tuple(float(np.clip(v, 0.0, 1.0)) for v in values)


def _se(cov: np.ndarray, n_eff: float, i: int, j: int, r: float) -> float:
    """√((C_ii − 2 r C_ij + r² C_jj) / n_eff): the standard error of `x̄_i − r x̄_j`.

    The form is the variance of `x_i − r x_j` over the steps, ≥ 0; where the steps' ratios
    agree it is 0, and the three terms cancel to a round-off of either sign (a window of a
    step with all-equal rewards, whose noise is 0, beside one with noise): held at 0, or the
    interval would read unbounded by the sign of a round-off. NaN (one step) stays NaN."""
    with np.errstate(invalid="ignore"):
        form = cov[i, i] - 2 * r * cov[i, j] + r * r * cov[j, j]
        return float(np.sqrt(np.maximum(form, 0.0) / n_eff))


def _ratio_se(cov: np.ndarray, n_eff: float, mean: np.ndarray, i: int, r: float) -> float:
    """The delta method's standard error of `r = x̄_i / t̄`: that of `x̄_i − r t̄`, over `t̄`."""
    return _se(cov, n_eff, i, _T, r) / mean[_T]


def _ends(point: float, half: float) -> tuple[float, float]:
    """`point ± half`; with no spread measurable (one step) the interval is unbounded, and
    undefined (NaN) with the point."""
    if math.isnan(point):
        return math.nan, math.nan
    if math.isnan(half):
        return -math.inf, math.inf
    return point - half, point + half


class WindowPool:
    """The last `window` steps pooled with equal weights: a deque of `window` step tuples."""

    def __init__(self, window: int) -> None:
        self.rows: deque[tuple[float, ...]] = deque(maxlen=window)

    def add(self, row: tuple[float, ...]) -> Pooled:
        """Add one step's tuple (`COLUMNS`, in order) and return the pooled estimates."""
        self.rows.append(row)
        return pooled_estimates(moments_of(np.array(self.rows, dtype=float)))


class EmaPool:
    """Every step pooled with weights `decay^(age in steps)`: its moments only."""

    def __init__(self, decay: float) -> None:
        self.decay = decay
        self.moments: Moments | None = None

    def add(self, row: tuple[float, ...]) -> Pooled:
        """Add one step's tuple (`COLUMNS`, in order) and return the pooled estimates."""
        self.moments = ema_step(self.moments, np.array(row, dtype=float), self.decay)
        return pooled_estimates(self.moments)
