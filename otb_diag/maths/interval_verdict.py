"""A claim read off a 95 % interval, in one of three words: it *holds* (the whole interval is on
the claim's side), it *does not hold* (the whole interval is on the other side: the interval
excludes it), or it is *not resolved* (the interval reaches the claim's threshold). A point
estimate alone never decides: an N′ of 10.4 with an interval reaching past 32 does not say
"N′ < 32".

Where the rewards carry nothing to compare (every group's rewards equal, or no positive
variance), no claim is read at all: `NO_SIGNAL`."""

from __future__ import annotations

import math

HOLDS = "holds"
FAILS = "does not hold"
NOT_RESOLVED = "not resolved"
NO_SIGNAL = "no signal"
VERDICTS = (HOLDS, FAILS, NOT_RESOLVED, NO_SIGNAL)


def at_least(low: float, high: float, threshold: float) -> str:
    """The claim `x ≥ threshold` from x's interval `[low, high]` (ends may be ±inf; a NaN end
    decides nothing): holds when `low ≥ threshold`, does not hold when `high < threshold`."""
    if math.isnan(low) or math.isnan(high):
        return NOT_RESOLVED
    if low >= threshold:
        return HOLDS
    if high < threshold:
        return FAILS
    return NOT_RESOLVED


def below(low: float, high: float, threshold: float) -> str:
    """The claim `x < threshold` from x's interval `[low, high]`: holds when `high < threshold`,
    does not hold when `low ≥ threshold` (the mirror of `at_least`)."""
    flipped = {HOLDS: FAILS, FAILS: HOLDS}
    verdict = at_least(low, high, threshold)
    return flipped.get(verdict, verdict)


def below_interval(x: tuple[float, float], y: tuple[float, float]) -> str:
    """The claim `x < y` from the intervals of both: holds when x's whole interval lies below
    y's (`x_high < y_low`), does not hold when it lies at or above it (`x_low ≥ y_high`)."""
    (x_low, x_high), (y_low, y_high) = x, y
    if any(math.isnan(v) for v in (x_low, x_high, y_low, y_high)):
        return NOT_RESOLVED
    if x_high < y_low:
        return HOLDS
    if x_low >= y_high:
        return FAILS
    return NOT_RESOLVED
