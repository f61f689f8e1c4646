"""The result of `otb-diag variance-compare`: summary.json's content as fields (the headline,
the paper-claim verdicts, the knee and the recommendation), and the text it prints."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import ClassVar, Protocol

from otb_diag.maths.interval_verdict import NO_SIGNAL
from otb_diag.pipelines.results import schema
from otb_diag.pipelines.results.schema import Distributed, RewardSignal, RunInputs, absent
from otb_diag.pipelines.variance.settings import VarianceSettings

# The paper's claim, declared here once (its abstract; the authors' post for the two settings):
# OTB with N = 4 responses per prompt matches the group-mean baseline with N = 32 in training
# performance (score over training), cutting token consumption by over 65 % (62 % single-turn,
# 66 % multi-turn tool-integrated reasoning), i.e. about 2.6–2.9× fewer tokens. That saving is
# at equal score over a run. variance-compare measures another quantity: the saving at equal
# gradient variance at one step, 1 − N/N′, which "N = 4 ≈ N = 32" would put at 87.5 %.
CLAIM_N, CLAIM_EQUIVALENT_N = 4, 32
PAPER_TOKEN_SAVING = 0.65  # "over 65 % fewer tokens", at equal score over training


def plus_minus(relative: float) -> str:
    """`±x %` of a relative error, or why there is none: NaN where no variance (or no
    baseline's, for the ratios) was positive, as when every reward of every group is equal."""
    if math.isfinite(relative):
        return f"±{relative:.1%}"
    return "not measurable (no variance above 0)"


@dataclass(frozen=True)
class HeadlineRow:
    """OTB against the mean baseline at one mode and N (the first aggregation, last checkpoint),
    each number with its 95 % interval (`pipelines/variance/evidence.py`), and whether OTB's
    variance is below the mean baseline's: `otb_below_mean`, read off the ratio's interval
    (`maths/interval_verdict.py`: holds, does not hold or not resolved)."""

    mode: str
    aggregation: str
    group_size: int
    otb_ratio_to_mean: float
    otb_ratio_to_mean_low: float
    otb_ratio_to_mean_high: float
    otb_ratio_to_rloo: float | None  # None: no rloo at this N, or its variance is 0
    equivalent_mean_group_size: float  # N′; inf beyond the measured N
    equivalent_range: str | None  # "beyond" / "below" the measured N, "within" inside
    # N′'s interval, each end a value and where it lies (as `equivalent_range`: an end
    # "beyond" is inf, above the largest N measured; one "below" is at most the smallest N)
    equivalent_low: float
    equivalent_low_range: str
    equivalent_high: float
    equivalent_high_range: str
    token_savings: float  # 1 − N/N′ (a bound where N′ is)
    token_savings_low: float
    token_savings_high: float
    otb_below_mean: str


class ClaimEvidence(Protocol):
    """What a paper-claim verdict reads: N′ at N = CLAIM_N with its interval, and the saving
    (a `HeadlineRow`, or a `ClaimVerdict` read back from its file)."""

    @property
    def equivalent_mean_group_size(self) -> float | None: ...
    @property
    def equivalent_range(self) -> str | None: ...
    @property
    def equivalent_low(self) -> float | None: ...
    @property
    def equivalent_low_range(self) -> str | None: ...
    @property
    def equivalent_high(self) -> float | None: ...
    @property
    def equivalent_high_range(self) -> str | None: ...
    @property
    def token_savings(self) -> float | None: ...
    @property
    def token_savings_low(self) -> float | None: ...
    @property
    def token_savings_high(self) -> float | None: ...


@dataclass(frozen=True, kw_only=True)
class ClaimVerdict:
    """The paper's headline read in one mode, at equal gradient variance: OTB at N = CLAIM_N
    matches the mean baseline at N′ (`token_savings` = 1 − N/N′ fewer sampled tokens), each with
    its 95 % interval, and two verdicts read off N′'s interval (`maths/interval_verdict.py`):
    `saving_verdict` on "> 65 % fewer tokens" read at equal variance, `verdict` on
    "N = 4 ≈ N = 32 at equal variance" (N′ ≥ 32), each "holds", "does not hold", "not resolved"
    or "no signal" (then no number: null). `text` gives both, each naming its quantity (ours at
    equal variance, the paper's > 65 % at equal score over training). Self-contained
    (figures.json carries it without the headline)."""

    mode: str
    # None (JSON null) where there is no number: "no signal"; an infinite N′ is null too
    equivalent_mean_group_size: float | None = None  # N′ at N = CLAIM_N; inf beyond
    equivalent_range: str | None = None  # "within", or "beyond" / "below" (N′ a bound)
    equivalent_low: float | None = None  # N′'s interval, its ends' ranges beside
    equivalent_low_range: str | None = None
    equivalent_high: float | None = None
    equivalent_high_range: str | None = None
    token_savings: float | None = None  # 1 − CLAIM_N/N′ at equal variance
    token_savings_low: float | None = None
    token_savings_high: float | None = None
    saving_verdict: str
    verdict: str
    text: str

    @classmethod
    def no_signal(cls, mode: str) -> ClaimVerdict:
        """The verdict of a mode where the rewards gave nothing to compare: every group's
        rewards equal (nothing measured), or no drawn group's (the mean baseline's variance
        0)."""
        return cls(
            mode=mode,
            saving_verdict=NO_SIGNAL,
            verdict=NO_SIGNAL,
            text=(
                "no signal: no group's rewards differ (the mean baseline's gradient variance "
                "is 0), so OTB has no N′ and no saving; "
                f"> {percent(PAPER_TOKEN_SAVING)} fewer tokens at equal variance: no signal; "
                f"N = {CLAIM_N} ≈ N = {CLAIM_EQUIVALENT_N} at equal variance: no signal"
            ),
        )


@dataclass(frozen=True)
class KneeRow:
    """The within-prompt share of a step's noise and the knee at one baseline and N, with 95 %
    intervals (`maths/noise/knee.py`; inf and NaN stay floats)."""

    baseline: str
    group_size: int
    within_share: float
    within_share_low: float
    within_share_high: float
    noise_scale: float
    noise_scale_low: float
    noise_scale_high: float
    noise_scale_tokens: float
    noise_scale_tokens_low: float
    noise_scale_tokens_high: float
    snr: float
    grad_sq_resolved: bool


@dataclass(frozen=True)
class Knee:
    """The knee rows of the most exact mode with a signal, for its first aggregation."""

    mode: str
    aggregation: str
    rows: list[KneeRow]


@dataclass(frozen=True)
class ZeroTailRow:
    """OTB with and without verl's zero tail on the same draws, at one N (`--zero-tail-split`;
    maths/variance/zero_tail.py defines every number)."""

    step: int
    mode: str
    aggregation: str
    group_size: int
    otb_variance: float
    no_zero_tail_variance: float
    tail_variance: float  # of the tail's part d_r = g_r(otb) − g_r(otb without the tail)
    tail_mean_square: float  # ‖E d‖², unbiased
    tail_mean_square_low: float
    tail_mean_square_high: float
    tail_bias_z: float
    mean_zero: bool  # the interval of ‖E d‖² holds 0

    def format(self) -> str:
        ratio = self.otb_variance / self.no_zero_tail_variance if self.no_zero_tail_variance else 0
        verdict = (
            "mean zero within its interval (variance only)"
            if self.mean_zero
            else "a mean of its own: on average it raises the tokens that carry the longest "
            "member past the second-longest, a push toward longer answers"
        )
        return (
            f"zero tail ({self.mode}, step {self.step}, N={self.group_size}): OTB variance "
            f"{self.otb_variance:.3g} with verl's zero tail, {self.no_zero_tail_variance:.3g} "
            f"without (×{ratio:.3g}); the tail's part: variance {self.tail_variance:.3g}, "
            f"‖mean‖² {self.tail_mean_square:.3g} "
            + bracketed(self.tail_mean_square_low, self.tail_mean_square_high)
            + f", z {self.tail_bias_z:.2g}: {verdict}"
        )


@dataclass(frozen=True)
class BaselineSpec:
    """One baseline as the paired draws computed it (`maths/variance/paired_draws.py:Spec`)."""

    label: str
    name: str
    energy: str | None
    handle_zero_tail: bool | None


@dataclass(frozen=True)
class Draws:
    """The paired draws of one mode at one checkpoint (`paired_draws.py:paired_draws`'s
    metadata): seed, sizes, pools and what the variance is."""

    mode: str
    seed: int
    draws: int
    bootstrap: int
    group_sizes: list[int]
    prompts: int
    pool_size_min: int
    pool_size_max: int
    constant_pools: int
    aggregations: list[str]
    specs: list[BaselineSpec]
    score_dim: int
    variance: str


@dataclass(frozen=True)
class KneeClaim:
    """The (baseline, N) with the fewest tokens a step at the knee (`maths/noise/knee.py`)."""

    baseline: str
    group_size: int
    noise_scale: float
    noise_scale_tokens: float
    noise_scale_tokens_low: float
    noise_scale_tokens_high: float


@dataclass(frozen=True)
class KneeReference:
    """The mean baseline at the trained N, the share of its noise between prompts, and its
    knee with the interval (`maths/noise/knee.py:recommendation_text` words them)."""

    baseline: str
    group_size: int
    resolved: bool
    noise_scale_tokens: float
    noise_scale_low: float
    between_share: float
    noise_scale: float
    noise_scale_tokens_low: float
    noise_scale_tokens_high: float


@dataclass(frozen=True, kw_only=True)
class Recommendation:
    """`maths/noise/knee.py:recommend`: the mode and aggregation it read (None: no mode with
    a signal, and then only `claim`, `verdict` where the rewards carried none, and `text`), the
    knee claimed (None: none resolved), the mean baseline beside it (absent when not measured),
    the verdict on "the knee claimed costs fewer tokens a step than mean's" read off both
    intervals (absent where no such comparison is stated) and the sentence."""

    mode: str | None
    aggregation: str | None = absent()
    current_n: int | None = absent()
    reference_n: int | None = absent()
    prompts: int | None = absent()
    few_prompts: bool | None = absent()
    claim: KneeClaim | None
    reference: KneeReference | None = absent()
    verdict: str | None = absent()
    text: str


@dataclass(frozen=True)
class FidelityRow:
    """One row of fidelity.csv: the proxy `w_t` against the true per-token `‖s_t‖²` of a block
    (`all`: the whole parameter vector) at a mode and step (`maths/variance/fidelity.py`)."""

    step: int
    mode: str
    block: str
    token_spearman: float
    token_pearson: float
    tokens: int
    sequence_spearman: float
    sequence_pearson: float
    sequences: int


@dataclass(frozen=True)
class ParameterBlock:
    """A block of a split full-mode projection: its name, first direction and directions."""

    block: str
    offset: int
    k: int


@dataclass(frozen=True)
class FullMode:
    """How a full-mode measurement was made (`pipelines/variance/conclusions.py:full_record`):
    engine, where ‖s_t‖² and the sequence's ‖Σ_t s_t‖² came from, the cost plan
    (`policy/scores/cost.py:FullPlan.as_dict`), the blocks and the measured projection error
    (`maths/variance/blocks.py:projection_error`; empty when not measured)."""

    engine: str
    sq_norm: str
    sequence_sq_norm: str
    plan: dict[str, float | str | None | dict[str, float]]
    blocks: list[ParameterBlock]
    jl_error: dict[str, float]


@dataclass(frozen=True)
class VarianceResult(schema.Versioned):
    """What `otb-diag variance-compare` measured and wrote (`to_json()` is its summary.json)."""

    command: ClassVar[str] = "variance-compare"

    inputs: RunInputs
    settings: VarianceSettings  # auto sizes as the run resolved them
    signal: RewardSignal  # the groups whose rewards carry a signal (none: nothing measured)
    draws: dict[str, Draws]  # "<mode>@<step>" -> the paired draws
    headline: list[HeadlineRow]
    paper_claim: list[ClaimVerdict]
    noise_scale: Recommendation
    knee: Knee | None  # None: no signal, nothing measured
    fidelity: list[FidelityRow]  # the rows of fidelity.csv
    distributed: Distributed
    full: dict[str, FullMode]  # step -> how full mode measured it
    timings: dict[str, float]  # "<phase>_s@<step>" and "total_s" -> seconds
    versions: dict[str, str]
    outputs: list[str]
    out: str
    zero_tail: list[ZeroTailRow] = field(default_factory=list)  # with --zero-tail-split

    @property
    def model_free(self) -> bool:
        return False  # variance-compare always runs the model

    @property
    def modes(self) -> list[str]:
        return list(self.settings.modes)

    @property
    def aggregation(self) -> str:
        """The first aggregation: the one the headline, figures and tables show."""
        return self.settings.aggregations[0]

    @property
    def group_sizes(self) -> list[int]:
        return list(self.settings.group_sizes)

    @property
    def sketch_dim(self) -> int:
        return self.settings.sketch_dim

    @property
    def recommendation(self) -> str:
        return self.noise_scale.text

    @property
    def recommendation_where(self) -> str:
        """The mode and aggregation the recommendation reads, or that no mode had a signal."""
        mode = self.noise_scale.mode
        return f"{mode} mode, {self.noise_scale.aggregation}" if mode else "no signal"

    def format(self) -> str:
        """The short human summary `otb-diag variance-compare` prints: whether the rewards carry
        a signal (when not all do), then the headline, plainly, each verdict with its
        interval."""
        signal = self.signal.sentence()
        lines = [f"{signal}."] if signal else []
        if not self.signal.carries_any:
            lines.append(
                "nothing compared: no checkpoint was loaded and no table or figure written; "
                "every verdict (the paper's claim in both readings, OTB against mean, the knee) "
                "is: no signal."
            )
            lines.append(f"wrote {', '.join(self.outputs)} to {self.out}")
            return "\n".join(lines)
        lines.append(
            f"{'mode':<6} {'N':>3} {'OTB/mean [95 %]':>22} {'OTB/RLOO':>9} "
            f"{'mean-equivalent N':>18} {'token saving':>13}  OTB < mean"
        )
        bound = {"beyond": "≥", "below": "≤"}  # savings are bounds outside the measured N
        max_n = max((h.group_size for h in self.headline), default=0)  # requested N ≤ M/2
        for h in self.headline:
            equiv, where = h.equivalent_mean_group_size, h.equivalent_range
            shown = f"> {max_n}" if where == "beyond" else (f"{equiv:.1f}")
            ratio = f"{h.otb_ratio_to_mean:.3f} " + bracketed(
                h.otb_ratio_to_mean_low, h.otb_ratio_to_mean_high
            )
            ratio_rloo = h.otb_ratio_to_rloo
            saving = f"{bound.get(where or '', '')}{h.token_savings:.0%}"
            lines.append(
                f"{h.mode:<6} {h.group_size:>3} {ratio:>22} "
                f"{(f'{ratio_rloo:.3f}' if ratio_rloo is not None else '-'):>9} {shown:>18} "
                f"{saving:>13}  {h.otb_below_mean}"
            )
        lines.append("")
        lines.append(
            "OTB/mean < 1 means OTB has lower variance than the group mean at the same N; "
            "the mean-equivalent N is the group size at which the mean baseline would "
            "reach OTB's variance (log-log interpolation over the measured N). A verdict holds "
            "or does not hold only where the 95 % interval lies wholly on one side; where it "
            "reaches the line (OTB/mean = 1, N′ = 32), it is not resolved."
        )
        lines += [f"paper's claim, {c.mode} mode: {c.text}." for c in self.paper_claim]
        lines += self._knee_lines()
        for step, full in self.full.items():
            err = full.jl_error
            lines.append(
                f"full mode (step {step}): engine {full.engine}, per-token ‖s_t‖² "
                f"{full.sq_norm}; sequence ‖Σ_t s_t‖²: {full.sequence_sq_norm}"
            )
            if err:
                lines.append(
                    f"projection error (k={err['k']}, measured over {err['subsketches']} "
                    f"sub-sketches): variances {plus_minus(err['variance_relative_error'])} "
                    f"(worst case √(2/k) = {err['theory_worst_case']:.1%}), ratios to mean "
                    f"{plus_minus(err['ratio_relative_error'])}"
                )
        for f in self.fidelity:
            if f.block != "all":
                continue
            lines.append(
                f"proxy fidelity ({f.mode}, step {f.step}): Spearman "
                f"{f.token_spearman:.3f}, Pearson {f.token_pearson:.3f} over {f.tokens} tokens"
            )
        lines += [row.format() for row in self.zero_tail]
        lines.append(f"wrote {len(self.outputs)} files to {self.out}")
        return "\n".join(lines)

    def _knee_lines(self) -> list[str]:
        """The split and the knee per baseline and N, then the recommendation."""
        knee = self.knee
        if knee is None:
            return [f"recommendation: {self.recommendation}"]
        lines = [
            "",
            f"noise of a step ({knee.mode} mode, {knee.aggregation}): the within-prompt share "
            "and the knee (in prompts, and in thousands of tokens a step, at the noise scale), "
            "with 95 % intervals",
            f"{'baseline':<12} {'N':>3} {'within':>22} {'knee prompts':>24} "
            f"{'knee tokens (×1,000)':>26}",
        ]
        for r in knee.rows:
            share = f"{r.within_share:.0%} " + bracketed(
                100 * r.within_share_low, 100 * r.within_share_high, fmt=".0f"
            )
            if knee.mode == "proxy":
                prompts = tokens = "-"
            elif not r.grad_sq_resolved:  # only a lower bound: |G|² may be 0
                prompts = f"≥ {r.noise_scale_low:.3g} (|G|² ~ 0)"
                tokens = f"≥ {r.noise_scale_tokens_low / 1e3:.3g} (|G|² ~ 0)"
            else:
                prompts = f"{r.noise_scale:.3g} " + bracketed(r.noise_scale_low, r.noise_scale_high)
                tokens = f"{r.noise_scale_tokens / 1e3:.3g} " + bracketed(
                    r.noise_scale_tokens_low, r.noise_scale_tokens_high, scale=1e3
                )
            lines.append(
                f"{r.baseline:<12} {r.group_size:>3} {share:>22} {prompts:>24} {tokens:>26}"
            )
        if knee.mode == "proxy":
            lines.append("proxy scores are noise independent of the reward: |G|² = 0, no knee.")
        if any(r.within_share > 1 for r in knee.rows):
            lines.append(
                "a within share above 100 % means the between-prompt estimate came out below 0 "
                "(its noise corrections exceed the measured spread): no between-prompt spread is "
                "measurable there."
            )
        lines.append(f"recommendation: {self.recommendation}")
        return lines


def percent(x: float) -> str:
    """A fraction as the sentences write it: 0.63 -> "63 %", -1 -> "−100 %"."""
    return f"{x:.0%}".replace("%", " %").replace("-", "−")


# Where an end of N′'s interval lies (`maths/variance/intervals.py:derived_intervals`): within
# the measured N, "beyond" the largest (N′ = inf: the high end unbounded, the low end only
# > max N) or "below" the smallest (a bound: at most that N). Each end is the number a verdict
# reads (`n_end`, `saving_end`), and the words print that number (`n_bound`, `saving_bound`):
# an interval and the verdict read off it say one thing.
LOW, HIGH, POINT = "low", "high", "point"


def _floored(x: float, digits: int) -> float:
    """`x` rounded down to `digits` decimals (after float noise below 1e-6 of the last digit
    is rounded off: 11.7 stays 11.7): an end as printed, so that the verdict, which reads it,
    and the reader of the printed interval put it on the same side of a threshold (32, 65 %)."""
    if not math.isfinite(x):
        return x
    return math.floor(round(x * 10**digits, 6)) / 10**digits


def n_end(value: float | None, where: str | None, max_n: int, end: str) -> float:
    """What an end (`LOW`, `HIGH`) of N′'s interval proves, the number a verdict reads and the
    interval prints: beyond the measured N, only N′ > `max_n` (a low end; a high end is
    unbounded, inf); below them, only N′ ≤ the smallest N (a low end could be any smaller N′:
    0); else the end to 0.1 (`_floored`). None is how a JSON file holds an infinite end."""
    if where == "beyond":
        return float(max_n) if end == LOW else math.inf
    if where == "below" and end == LOW:
        return 0.0
    return math.inf if value is None else _floored(float(value), 1)


def saving_end(value: float | None, where: str | None, end: str) -> float:
    """What an end (`LOW`, `HIGH`) of the saving's interval `1 − N/N′` proves, as `n_end` of
    N′'s: 100 % for a high end past the measured N (N′ → ∞), −inf for a low end below them
    (N′ → 0); else the saving at that end, to 1 % (`_floored`; None: unknown, NaN)."""
    if where == "beyond" and end == HIGH:
        return 1.0
    if where == "below" and end == LOW:
        return -math.inf
    return math.nan if value is None else _floored(float(value), 2)


def n_bound(value: float | None, where: str | None, max_n: int, end: str = POINT) -> str:
    """An N′ (`POINT`) or an end of its interval (`LOW`, `HIGH`: the number `n_end` reads, to
    0.1) in words: a number; beyond the measured N, `> max N` (a high end there is unbounded:
    ∞); below them, `≤` the smallest N (None: an infinite N′ as JSON holds it)."""
    if end != POINT and where == "beyond":
        return f"> {max_n}" if end == LOW else "∞"
    if value is None or math.isinf(value):
        number = "∞"
    else:
        number = f"{value if end == POINT else _floored(value, 1):.1f}"
    return {"beyond": f"> {max_n}", "below": f"≤ {number}"}.get(where or "", number)


def saving_bound(value: float | None, where: str | None, end: str = POINT) -> str:
    """The saving `1 − N/N′` (`POINT`) or an end of its interval (`LOW`, `HIGH`: the number
    `saving_end` reads, to 1 %) in words: at least that beyond the measured N (a high end
    there is unbounded: 100 %), at most that below them."""
    if end == HIGH and where == "beyond":
        return percent(saving_end(value, where, end))
    rounded = value if value is None or end == POINT else _floored(value, 2)
    shown = "?" if rounded is None else percent(rounded)
    return {"beyond": f"≥ {shown}", "below": f"≤ {shown}"}.get(where or "", shown)


def equivalent_interval(e: ClaimEvidence, max_n: int) -> str:
    """N′'s 95 % interval in words, as the verdicts read it: `95 % interval ≤ 2.0 to 9.5`, or
    `95 % interval 2.6 to ∞, its upper end past N = 4, the largest N measured`."""
    low = n_bound(e.equivalent_low, e.equivalent_low_range, max_n, LOW)
    high = n_bound(e.equivalent_high, e.equivalent_high_range, max_n, HIGH)
    past = (
        f", its upper end past N = {max_n}, the largest N measured"
        if e.equivalent_high_range == "beyond"
        else ""
    )
    return f"95 % interval {low} to {high}{past}"


def saving_interval(e: ClaimEvidence) -> str:
    """The saving's 95 % interval in words, as the verdicts read it: `95 % interval ≤ −100 % to
    100 %` (an upper end past the measured N is unbounded: 100 %)."""
    low = saving_bound(e.token_savings_low, e.equivalent_low_range, LOW)
    high = saving_bound(e.token_savings_high, e.equivalent_high_range, HIGH)
    return f"95 % interval {low} to {high}"


def saving_words(saving: float, where: str | None) -> str:
    """`1 − N/N′` in words: fewer (or more) sampled tokens, a bound outside the measured N
    (at least beyond it, at most below it; a bound on more tokens turns the other way)."""
    bound = {"beyond": "at least ", "below": "at most "}.get(where or "", "")
    if saving >= 0:
        return f"{bound}{percent(saving)} fewer sampled tokens"
    flipped = {"at least ": "at most ", "at most ": "at least "}.get(bound, "")
    return f"{flipped}{percent(-saving)} more sampled tokens"


def interval_end(x: float | None, fmt: str = ".3g", scale: float = 1.0) -> str:
    """An end of an interval as every summary, page and verdict prints it: None is how a
    results file holds an infinite end (JSON's null), printed ∞ as inf is."""
    return "∞" if x is None or x == math.inf else format(x / scale, fmt)


def bracketed(low: float, high: float, scale: float = 1.0, fmt: str = ".3g") -> str:
    """`[low, high]` as every table prints an interval (`interval_end`)."""
    return f"[{interval_end(low, fmt, scale)}, {interval_end(high, fmt, scale)}]"
