"""Physical consistency of the probabilities a rollout row logs (docs/theory.md §2).

For the sampling distribution `π_t` and the sampled token's probability `p_t = exp(logprob_t)`:

| rule | why |
|---|---|
| `logprob_t ≤ 0` | `p_t ≤ 1` |
| `0 < sum_pi2_t ≤ 1` | `Σ_v π_t(v)²` of a distribution lies in `[1/V, 1]` |
| `sum_pi2_t ≥ p_t²` | one of the squares summed is `p_t²` |
| `is_weights_t ≥ 0` (and finite) | a truncated ratio of probabilities |
| `temperature > 0` | checked where the row is parsed |

Trainers often compute these in bfloat16, whose 8-bit significand rounds a value near 1 by up to
`2⁻⁸`: a token with `p ≈ 1` may log `logprob = +0.0039`, or `sum_pi2 = 1.0039`. Values beyond a
rule by at most `TOLERANCE = 2⁻⁷` (two bf16 steps at 1; relative to `p²` for the third rule)
are clamped onto the rule and counted (`summary.json`, `consistency`); anything further is an
impossible number: with `sum_pi2 < p²` the proxy `w = 1 − 2p + sum_pi2` can go negative and an
energy-weighted baseline leaves the range of the rewards. Those raise an `InputError` naming
the file, row, field, position, value and the rule. `sum_pi2 ≤ 0` and negative importance
weights have no round-off excuse (bf16 keeps sign and represents `1/V`) and are never clamped.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import replace

import numpy as np

from otb_diag.errors import InputError
from otb_diag.io.rollouts.rows import Response

TOLERANCE = 2.0**-7
CLAMPED_FIELDS = ("logprobs", "sum_pi2")

Fail = Callable[[str, str, str], InputError]  # (canonical field, message, hint) -> error


def check_probabilities(r: Response, fail: Fail) -> tuple[Response, dict[str, int]]:
    """`r` with round-off clamped, and how many entries of each field were clamped; raises the
    error `fail` makes for the first entry beyond the tolerance.

    Whole rows are checked with numpy (`_clean_rows`); a row where that finds an entry beyond a
    rule goes through the entry-by-entry loop (`_clean_entries`), which names the first one."""
    clean = _clean_rows(r)
    if clean is None:
        clean = _clean_entries(r, fail)
    logprobs, sum_pi2, counts = clean
    return replace(r, logprobs=logprobs, sum_pi2=sum_pi2), counts


_Cleaned = tuple[list[float] | None, list[float] | None, dict[str, int]]


def _clean_rows(r: Response) -> _Cleaned | None:
    """`_clean_entries`' result with array operations, or None when some entry may break a rule.

    Exactly the loop's values: `where(lp > 0, 0, lp)` is `min(lp, 0.0)`; `np.exp` may differ
    from `math.exp` in the last bit, so entries whose `sum_pi2` is within 1e-9 (relative) of
    `p²` or below it, the only ones where `p²` changes the outcome, take the loop's own
    `math.exp` (below that margin `max(s, p²)` is `s` and the rule `s ≥ p²(1 − tol)` holds)."""
    counts = dict.fromkeys(CLAMPED_FIELDS, 0)
    logprobs = sum_pi2 = None
    lp = None
    if r.logprobs is not None:
        lp = np.asarray(r.logprobs, dtype=np.float64)
        if (lp > TOLERANCE).any():
            return None
        counts["logprobs"] = int((lp > 0).sum())
        lp = np.where(lp > 0, 0.0, lp)  # min(lp, 0.0)
        logprobs = lp.tolist()
    if r.sum_pi2 is not None:
        s = np.asarray(r.sum_pi2, dtype=np.float64)
        if ((s <= 0) | (s > 1 + TOLERANCE)).any():
            return None
        p_sq = np.zeros_like(s)
        if lp is not None:
            n = min(len(lp), len(s))
            p_sq[:n] = np.exp(2 * lp[:n])
        clean = np.minimum(s, 1.0)
        for i in np.flatnonzero(s <= p_sq * (1 + 1e-9)).tolist():
            exact = math.exp(2 * logprobs[i]) if logprobs is not None and i < len(logprobs) else 0
            if s[i] < exact * (1 - TOLERANCE):
                return None
            clean[i] = min(max(float(s[i]), exact), 1.0)
        counts["sum_pi2"] = int((clean != s).sum())
        sum_pi2 = clean.tolist()
    if r.is_weights is not None and (np.asarray(r.is_weights, dtype=np.float64) < 0).any():
        return None
    return logprobs, sum_pi2, counts


def _clean_entries(r: Response, fail: Fail) -> _Cleaned:
    """Entry by entry: the reference `_clean_rows` follows; raises at the first bad entry."""
    counts = dict.fromkeys(CLAMPED_FIELDS, 0)
    logprobs = None
    if r.logprobs is not None:
        logprobs = []
        for i, lp in enumerate(r.logprobs):
            if lp > TOLERANCE:
                raise _impossible(fail, "logprobs", i, lp, "logprobs ≤ 0 (a probability ≤ 1)")
            counts["logprobs"] += lp > 0
            logprobs.append(min(lp, 0.0))
    sum_pi2 = None
    if r.sum_pi2 is not None:
        sum_pi2 = []
        for i, s in enumerate(r.sum_pi2):
            if s <= 0:
                raise _impossible(fail, "sum_pi2", i, s, "sum_pi2 > 0", tolerated=False)
            if s > 1 + TOLERANCE:
                raise _impossible(fail, "sum_pi2", i, s, "sum_pi2 ≤ 1")
            p_sq = math.exp(2 * logprobs[i]) if logprobs is not None and i < len(logprobs) else 0
            if s < p_sq * (1 - TOLERANCE):
                rule = f"sum_pi2 ≥ p² = {p_sq:.6g} (p = exp(logprobs[{i}]))"
                raise _impossible(fail, "sum_pi2", i, s, rule, relative=True)
            clean = min(max(s, p_sq), 1.0)
            counts["sum_pi2"] += clean != s
            sum_pi2.append(clean)
    if r.is_weights is not None:
        for i, rho in enumerate(r.is_weights):
            if rho < 0:
                raise _impossible(fail, "is_weights", i, rho, "is_weights ≥ 0", tolerated=False)
    return logprobs, sum_pi2, counts


def _impossible(
    fail: Fail,
    field: str,
    position: int,
    value: float,
    rule: str,
    *,
    tolerated: bool = True,
    relative: bool = False,
) -> InputError:
    room = (
        f" beyond the bf16 round-off tolerance ({'relative ' if relative else ''}{TOLERANCE:g})"
        if tolerated
        else ""
    )
    return fail(
        field,
        f"position {position}: value {value!r} breaks the rule {rule}{room}; it is not a "
        "possible probability statistic.",
        "Check how the trainer logs it (log-probs of the sampled tokens, Σπ² of the tempered "
        "distribution), or measure under a checkpoint with --ckpt instead of --model-free.",
    )
