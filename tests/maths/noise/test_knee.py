"""The knee per (baseline, N) and the recommendation (maths/noise/knee.py) on planted cases."""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest

from otb_diag.io.atomic import json_text
from otb_diag.maths.noise.knee import (
    cheaper_verdict,
    no_signal,
    noise_table,
    recommend,
    recommendation_text,
)
from otb_diag.maths.variance.paired_draws import BaselineSpec, DrawSet, PairedDraws

SIZES = (2, 4, 8, 16)
# Per-response noise tr Cov of each planted baseline: otb removes more of it than mean.
NOISE = {"mean": 36.0, "otb": 16.0}
BETWEEN, SIGNAL, K = 1.0, 9.0, 8


def planted_truth(baseline: str, n: int, tokens: float) -> dict[str, float]:
    """A group baseline shrinks the expected estimate by f = (N − 1)/N (the response's own
    reward in its baseline), so `|G|²` and the between term carry f², while the within term is
    `noise / N`: the knee's tokens `B·N·L̄` have a minimum inside the measured N."""
    f = (n - 1) / n
    within, between, grad_sq = NOISE[baseline] / n, f * f * BETWEEN, f * f * SIGNAL
    scale = (within + between) / grad_sq
    return {"noise_scale": scale, "noise_scale_tokens": scale * n * tokens}


def planted_paired(seed: int, prompts: int = 256, draws: int = 100) -> PairedDraws:
    """Paired draws of fresh Gaussian estimates `ĝ_{r,p} = f (G + b_p) + e_{r,p}` per baseline
    and N (`tr Cov b = BETWEEN`, `|G|² = SIGNAL`, `tr Cov e = NOISE[b] / N`), as
    `paired_estimates` would hand them over (only the per-prompt moments are read)."""
    rng = np.random.default_rng(seed)
    g = np.zeros(K)
    g[0] = math.sqrt(SIGNAL)
    mu = g + rng.normal(0, math.sqrt(BETWEEN / K), (prompts, K))
    per_size = {}
    for n in SIZES:
        f = (n - 1) / n
        sets = {}
        for baseline, noise in NOISE.items():
            est = f * mu[:, None] + rng.normal(0, math.sqrt(noise / n / K), (prompts, draws, K))
            g_r = est.mean(1)  # unused by the knee, kept for the shape of a DrawSet
            sets["token-sum", baseline] = DrawSet(g_r, g_r, est.sum(1), np.square(est).sum(1))
        per_size[n] = (sets, np.zeros((1, draws)), 0)
    specs = [BaselineSpec(b, b) for b in NOISE]
    return PairedDraws(
        per_size, specs, ["token-sum"], list(SIZES), draws, prompts, {"mode": "head"},
        np.full(prompts, np.inf),
    )  # fmt: skip


def test_the_recommendation_picks_the_planted_optimum() -> None:
    tokens = 300.0
    truth = {(b, n): planted_truth(b, n, tokens) for b in NOISE for n in SIZES}
    best = min(truth, key=lambda key: truth[key]["noise_scale_tokens"])
    runner_up = sorted(v["noise_scale_tokens"] for v in truth.values())[1]
    assert best == ("otb", 8)  # the planted optimum, inside the measured N
    assert runner_up > 1.1 * truth[best]["noise_scale_tokens"]  # (otb, 4): 12 % dearer
    for seed in range(5):
        table = noise_table(planted_paired(seed), tokens)
        advice = recommend(table, current_n=8)
        claim = advice["claim"]
        assert (claim["baseline"], claim["group_size"]) == best
        exact = truth[best]["noise_scale_tokens"]
        assert claim["noise_scale_tokens_low"] <= exact <= claim["noise_scale_tokens_high"]
        assert advice["reference"]["group_size"] == 8
        assert advice["text"].startswith("otb at N = 8: knee at ~")
        row = table[(table["baseline"] == "mean") & (table["group_size"] == 8)].iloc[0]
        assert row["noise_scale_responses"] == pytest.approx(row["noise_scale"] * 8)
        assert row["noise_scale_tokens"] == pytest.approx(row["noise_scale"] * 8 * tokens)


def knee_row(baseline: str, n: int, tokens: float, resolved: bool, mode: str = "head") -> dict:
    return {
        "mode": mode, "aggregation": "token-sum", "baseline": baseline, "group_size": n,
        "noise_scale": tokens / n, "noise_scale_low": tokens / n / 2,
        "noise_scale_tokens": tokens, "noise_scale_tokens_low": tokens / 2,
        "noise_scale_tokens_high": tokens * 2, "grad_sq_resolved": resolved,
        "within_share": 0.75, "prompts": 32,
    }  # fmt: skip


def test_unresolved_rows_and_true_energies_are_never_recommended() -> None:
    table = pd.DataFrame(
        [
            knee_row("otb-true", 4, 100.0, True),  # no trainer has exact energies
            knee_row("otb", 4, 150.0, False),  # |G|² not resolved
            knee_row("mean", 4, 400.0, True),
            knee_row("mean", 8, 300.0, True),
        ]
    )
    advice = recommend(table, current_n=6)
    assert (advice["claim"]["baseline"], advice["claim"]["group_size"]) == ("mean", 8)
    # N = 6 was not measured: the nearest measured N, the smaller on a tie, is the reference.
    assert advice["reference_n"] == 4
    assert "N = 6 was not measured" in advice["text"]
    assert "no baseline can cut its knee by more than 75%" in advice["text"]


def test_the_knee_claimed_is_cheaper_than_means_by_the_intervals() -> None:
    """The claim's tokens interval wholly below mean's at the reference N: holds; overlapping:
    not resolved (a point estimate half mean's is not enough); wholly above: does not hold; no
    comparison where the claim is mean's own knee or none is claimed."""
    table = pd.DataFrame([knee_row("otb", 4, 50.0, True), knee_row("mean", 8, 300.0, True)])
    advice = recommend(table, current_n=8)
    assert advice["verdict"] == "holds"  # otb [25, 100] against mean [150, 600]
    assert "the knee claimed costs fewer tokens a step than mean's at N = 8: holds (its " \
        "tokens' interval lies below mean's)" in advice["text"]  # fmt: skip
    table = pd.DataFrame([knee_row("otb", 4, 150.0, True), knee_row("mean", 8, 300.0, True)])
    advice = recommend(table, current_n=8)
    assert advice["verdict"] == "not resolved" and "the two tokens' intervals overlap" in \
        advice["text"]  # fmt: skip
    ref = {**knee_row("mean", 8, 300.0, True), "resolved": True}
    assert cheaper_verdict(knee_row("otb", 4, 2000.0, True), ref) == "does not hold"
    # mean's knee unresolved: its interval open above, so only an overlap or a win
    open_ref = {**ref, "resolved": False, "noise_scale_tokens_high": None}
    assert cheaper_verdict(knee_row("otb", 4, 1000.0, True), open_ref) == "not resolved"
    assert cheaper_verdict(knee_row("mean", 8, 300.0, True), ref) is None  # the claim is mean's
    assert cheaper_verdict(None, ref) is None
    alone = recommend(pd.DataFrame([knee_row("mean", 8, 300.0, True)]), current_n=8)
    assert "verdict" not in alone or alone["verdict"] is None


def test_rewards_without_signal_have_no_knee() -> None:
    advice = no_signal()
    assert (advice["mode"], advice["claim"], advice["verdict"]) == (None, None, "no signal")
    assert advice["text"].startswith("no knee: the rewards carry no signal")
    record = {k: v for k, v in advice.items() if k != "text"}
    assert recommendation_text(json.loads(json_text(record))) == advice["text"]


def test_a_negative_between_estimate_is_not_printed_as_a_share() -> None:
    row = knee_row("mean", 8, 300.0, True)
    row["within_share"] = 1.02  # between came out below 0
    advice = recommend(pd.DataFrame([row]), current_n=8)
    assert "no between-prompt spread is measurable" in advice["text"]
    assert "-" not in advice["text"].split("measurable")[1].split(")")[0]
    assert advice["reference"]["between_share"] == pytest.approx(-0.02)


def test_no_resolved_knee_claims_none_and_says_so() -> None:
    table = pd.DataFrame([knee_row("otb", 4, 150.0, False), knee_row("mean", 8, 300.0, False)])
    advice = recommend(table, current_n=8)
    assert advice["claim"] is None
    assert "no knee is claimed" in advice["text"]
    assert "at least 18.8 prompts" in advice["text"]  # mean's lower bound, 300 / 8 / 2


def test_proxy_mode_has_no_knee() -> None:
    proxy = pd.DataFrame([knee_row("otb", 4, 150.0, True, mode="proxy")])
    advice = recommend(proxy, current_n=8)
    assert advice["mode"] is None and advice["claim"] is None
    assert "|G|² = 0 by construction" in advice["text"]


def test_few_prompts_are_flagged() -> None:
    rows = [knee_row("mean", 8, 300.0, True)]
    rows[0]["prompts"] = 8
    advice = recommend(pd.DataFrame(rows), current_n=8)
    assert advice["few_prompts"] and "only 8 prompts" in advice["text"]


@pytest.mark.parametrize(
    ("rows", "current_n"),
    [
        ([knee_row("otb", 4, 150.0, True), knee_row("mean", 8, 300.0, True)], 8),  # both knees
        ([knee_row("otb", 4, 50.0, True), knee_row("mean", 8, 300.0, False)], 8),  # cheaper
        ([knee_row("otb", 4, 150.0, False), knee_row("mean", 8, 300.0, False)], 6),  # none
        ([{**knee_row("mean", 8, 300.0, False), "noise_scale_low": math.inf}], 8),  # no signal
        ([{**knee_row("mean", 8, 300.0, True), "within_share": 1.02}], 8),  # between below 0
        ([{**knee_row("mean", 8, 300.0, True), "noise_scale_tokens_high": math.inf}], 8),
        ([knee_row("otb", 4, 150.0, True, mode="proxy")], 8),  # no mode with a signal
    ],
)
def test_the_text_is_rewritten_from_the_record_alone(rows: list[dict], current_n: int) -> None:
    """`recommendation_text` gives `recommend`'s sentence back from its record, also as a
    JSON file holds it (non-finite numbers as null): a committed record's sentence can be
    checked against today's wording (tests/pipelines/test_committed_figures.py)."""
    advice = recommend(pd.DataFrame(rows), current_n=current_n)
    record = {k: v for k, v in advice.items() if k != "text"}
    assert recommendation_text(record) == advice["text"]
    assert recommendation_text(json.loads(json_text(record))) == advice["text"]
