"""Training collapse, the variance signal's lead time and tokens to a target score
(docs/theory.md §5).

Collapse shows as a sudden, lasting surge of the gradient norm, preceded by growing gradient
variance, after which the score craters. Everything here works on one run's tidy table
(`training_logs.COLUMNS`) and counts in *logged points* (rows with a finite, positive value), so
a log written every k steps needs no resampling; steps are only used to report.

**Robust z-score.** For a positive series `v`, `x = log v`; at point i, with `prev` the up to
`window` points before i,

    z_i = (x_i - median(prev)) / max(1.4826 * MAD(prev), min_scale),

NaN while fewer than `min_points` points precede i. The log makes a surge a ratio (a jump from
0.1 to 1 counts as much as from 10 to 100); median and MAD ignore the odd spike in the history;
1.4826 makes the MAD a standard deviation for normal noise; `min_scale` (in log units) keeps a
run with an unusually steady norm from being flagged for a drift of a few percent.

**Collapse.** The first point of the first `persist` consecutive points with
`z > threshold` on the gradient norm; its step is the collapse step (None if there is none).
Requiring `persist` points ignores the isolated spikes real runs have.

**Defaults** (window 30, at least 10 points, threshold 6, persist 3) were chosen by simulating
flat logs of 300 points with normal noise on log grad_norm: window 20 / 5 points / persist 2
flagged 0.4 % of them (mostly in the first points, where a MAD of 5 values is often tiny), window
30 / 10 points / persist 2 still 0.04 %, the defaults none of 20,000.

**Lead time.** The same z-score on the log's `variance_proxy`, with the lower
`lead_threshold`; the warning is the first alarm (again `persist` consecutive points) that
starts among the `lead_horizon` points of the variance proxy up to and including the collapse
step, and lead = collapse step - warning step (0 when both rise together; None when the signal
does not rise first, there is no collapse, or the log has no variance proxy). The horizon keeps
an early-training transient from passing for a warning hundreds of steps ahead. There is no
stand-in for a missing proxy: a rolling variance of the gradient norm overlaps itself from one
point to the next, so its trailing MAD is too small and it raised false warnings within 50
points of a flat log in 15-40 % of simulated runs (5-20 point windows).

**Tokens to target.** The score is smoothed by a trailing mean over `smooth` logged points
(no value until `smooth` points exist, so one lucky batch does not count); the answer is
`tokens_sampled` at the first point where the smoothed score reaches the target and a token
count is logged (None if never, or if the log has no token counts). Rows without a score are
left out of the smoothing.

**Updates to target.** At that same row, the optimizer updates the policy had taken when it
generated the row's batch (the table's `updates`, `io/training_logs.py`: the knee controller's
count where the run logged one, several generation batches making one update there, else
step − 1). Steps against tokens is the trade-off a batch size sets (McCandlish et al. 2018): a
larger batch takes fewer sequential updates and more tokens to the same score.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np
import pandas as pd

from otb_diag.dynamics.detection_rule import DetectionRule as DetectionRule  # re-exported

MAD_TO_SD = 1.4826  # MAD of a normal sample times this estimates its standard deviation


def robust_z(x: np.ndarray, window: int, min_points: int, min_scale: float) -> np.ndarray:
    """Robust z-score of each value of `x` against the up to `window` values before it."""
    z = np.full(len(x), np.nan)
    for i in range(min_points, len(x)):
        prev = x[max(0, i - window) : i]
        median = np.median(prev)
        scale = max(MAD_TO_SD * np.median(np.abs(prev - median)), min_scale)
        z[i] = (x[i] - median) / scale
    return z


def first_alarm(z: np.ndarray, threshold: float, persist: int, start: int = 0) -> int | None:
    """Index of the first point at or after `start` that begins `persist` consecutive points
    with `z > threshold` (NaN counts as below), or None."""
    streak = 0
    for i in range(start, len(z)):
        streak = streak + 1 if z[i] > threshold else 0
        if streak == persist:
            return i - persist + 1
    return None


def _log_points(steps: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Row positions, steps and log values of the finite, positive entries of `values`."""
    rows = np.flatnonzero(np.isfinite(values) & (values > 0))
    return rows, steps[rows], np.log(values[rows])


def smoothed_score(score: np.ndarray, smooth: int) -> np.ndarray:
    """Trailing mean over `smooth` logged scores, per row (NaN on rows without a score and
    until `smooth` scores exist)."""
    rows = np.flatnonzero(np.isfinite(score))
    mean = pd.Series(score[rows]).rolling(smooth, min_periods=smooth).mean().to_numpy()
    return _per_row(len(score), rows, mean)


def target_row(tokens: np.ndarray, smoothed: np.ndarray, target: float) -> int | None:
    """[rows] -> the first row whose smoothed score reaches `target` and that has a token
    count, or None."""
    hits = np.flatnonzero((smoothed >= target) & np.isfinite(tokens))
    return int(hits[0]) if len(hits) else None


@dataclass(frozen=True)
class RunDynamics:
    """What the rules found in one run; `grad_norm_z`, `variance_z` and `score_smoothed` are
    per row of the run's table (NaN where undefined)."""

    collapse_step: int | None
    collapse_z: float | None
    warning_step: int | None
    lead_steps: int | None
    variance_proxy_kind: str
    tokens_to_target: float | None
    updates_to_target: int | None  # at the row of `tokens_to_target`
    grad_norm_z: np.ndarray
    variance_z: np.ndarray
    score_smoothed: np.ndarray

    def summary(self) -> dict[str, object]:
        """The scalar results, JSON-ready."""
        fields = asdict(self)
        for per_row in ("grad_norm_z", "variance_z", "score_smoothed"):
            del fields[per_row]
        return fields


def analyse_run(
    frame: pd.DataFrame, rule: DetectionRule, target: float | None = None
) -> RunDynamics:
    """Collapse step, warning step and lead, and tokens and updates to `target` for one run's
    table."""
    steps = frame["step"].to_numpy()
    grad_rows, grad_steps, grad_x = _log_points(steps, frame["grad_norm"].to_numpy(dtype=float))
    grad_z = robust_z(grad_x, rule.window, rule.min_points, rule.min_scale)
    alarm = first_alarm(grad_z, rule.threshold, rule.persist)
    collapse_step = int(grad_steps[alarm]) if alarm is not None else None

    proxy = frame["variance_proxy"].to_numpy(dtype=float)
    var_rows, var_steps, var_x = _log_points(steps, proxy)
    var_z = robust_z(var_x, rule.window, rule.min_points, rule.min_scale)
    warning_step = None
    if collapse_step is not None:
        # Points of the variance proxy up to the collapse; the alarm must start among the
        # last `lead_horizon` of them (its persistence may run past the collapse).
        upto = int(np.searchsorted(var_steps, collapse_step, side="right"))
        start = max(0, upto - rule.lead_horizon)
        warning = first_alarm(var_z, rule.lead_threshold, rule.persist, start)
        if warning is not None and warning < upto:
            warning_step = int(var_steps[warning])

    smoothed = smoothed_score(frame["score"].to_numpy(dtype=float), rule.smooth)
    tokens_sampled = frame["tokens_sampled"].to_numpy(dtype=float)
    row = target_row(tokens_sampled, smoothed, target) if target is not None else None
    return RunDynamics(
        collapse_step=collapse_step,
        collapse_z=float(grad_z[alarm]) if alarm is not None else None,
        warning_step=warning_step,
        lead_steps=collapse_step - warning_step if warning_step is not None else None,
        variance_proxy_kind=str(frame["variance_proxy_kind"].iloc[0]) if len(frame) else "none",
        tokens_to_target=float(tokens_sampled[row]) if row is not None else None,
        updates_to_target=int(frame["updates"].iloc[row]) if row is not None else None,
        grad_norm_z=_per_row(len(frame), grad_rows, grad_z),
        variance_z=_per_row(len(frame), var_rows, var_z),
        score_smoothed=smoothed,
    )


def _per_row(n: int, rows: np.ndarray, values: np.ndarray) -> np.ndarray:
    out = np.full(n, np.nan)
    out[rows] = values
    return out
