"""Every committed figure set's figures.json is what today's code writes: the typed result
writes the file back key for key, and each sentence it stores is the one today's code words
from the numbers stored beside it (the paper-claim verdicts from N′ and its interval,
`claim_verdict`; the recommendation, `recommendation_text`; the learning-rate sweep's reason,
`choose_lr`). A wording change fails here until the sets are regenerated (`otb-diag figures`,
figures/README.md).
No model runs: the sentences are rebuilt from the files alone."""

import json
from pathlib import Path
from typing import Any

import pytest

from otb_diag.dynamics.lr_sweep import Stability, choose_lr
from otb_diag.maths.noise.knee import recommendation_text
from otb_diag.pipelines.figures.recipe import FigurePlan
from otb_diag.pipelines.results.figures import FiguresResult
from otb_diag.pipelines.results.schema import build
from otb_diag.pipelines.variance.conclusions import claim_verdict

ROOT = Path(__file__).resolve().parents[2]
# figures/ and each scenario's set beside it (figures/long/); runs/ holds no figures.json.
COMMITTED = sorted([ROOT / "figures" / "figures.json", *ROOT.glob("figures/*/figures.json")])


def _read(path: Path) -> tuple[dict[str, Any], FiguresResult]:
    """The file's JSON and its typed result; a file missing a field today's result has is
    stale (written by older code)."""
    data = json.loads(path.read_text(encoding="utf-8"))
    try:
        return data, build(FiguresResult, data)
    except (KeyError, TypeError) as err:
        pytest.fail(f"{path.relative_to(ROOT)} lacks a field or has a wrong one ({err}): stale")


def _name(path: Path) -> str:
    return str(path.relative_to(ROOT))


def test_every_figure_set_is_found() -> None:
    assert [_name(p) for p in COMMITTED] == ["figures/figures.json", "figures/long/figures.json"]


@pytest.mark.parametrize("path", COMMITTED, ids=_name)
def test_the_result_writes_the_committed_file(path: Path) -> None:
    """figures.json carries no schema version: the typed result writes the committed file's
    content, key for key and in order."""
    data, result = _read(path)
    written = result.to_json()
    assert written == data and json.dumps(written) == json.dumps(data)


@pytest.mark.parametrize("path", COMMITTED, ids=_name)
def test_the_paper_claim_is_todays_wording(path: Path) -> None:
    """Each mode's verdicts and text from its stored N′, saving and their intervals (the largest
    N measured: the largest of the scenario's plan, every pool holding twice as many)."""
    _, result = _read(path)
    assert result.paper_claim, "a full figure set measures N = 4"
    max_n = max(FigurePlan.make(result.quick, result.scenario).group_sizes)
    for claim in result.paper_claim:
        assert claim == claim_verdict(claim.mode, claim, max_n)


def test_the_embedded_defaults_head_claim_is_not_resolved() -> None:
    """Its N′ interval reaches past the largest N its pools of 32 show (16), so it cannot
    exclude N′ ≥ 32: "not resolved", never "does not hold", the sentence giving the interval."""
    _, result = _read(ROOT / "figures" / "figures.json")
    assert result.paper_claim is not None
    (head,) = [c for c in result.paper_claim if c.mode == "head"]
    assert head.equivalent_high_range == "beyond"
    assert head.verdict == "not resolved"
    assert "(95 % interval ≤ 2.0 to ∞, its upper end past N = 16, the largest N measured)" in (
        head.text
    )
    assert head.text.endswith(
        "N = 4 ≈ N = 32 at equal variance: not resolved (N′ up to 16 can "
        "be measured here; N′ ≥ 32 needs N = 32 measured, pools of M ≥ 64)"
    )


@pytest.mark.parametrize("path", COMMITTED, ids=_name)
def test_the_recommendation_is_todays_wording(path: Path) -> None:
    data, result = _read(path)
    assert result.noise_scale is not None, "a full figure set runs variance-compare"
    assert result.noise_scale.text == recommendation_text(data["noise_scale"])


@pytest.mark.parametrize("path", COMMITTED, ids=_name)
def test_the_sweep_is_todays_choice_and_wording(path: Path) -> None:
    """The rate chosen and its reason from each rate's stored stability, in the sets whose
    plan sweeps the rate (long)."""
    _, result = _read(path)
    swept = bool(FigurePlan.make(result.quick, result.scenario).sweep_lrs)
    assert (result.sweep is not None) == swept
    if result.sweep is None:
        return
    runs = [
        Stability(r.lr, r.surge_step, r.early_score, r.late_score, r.reward_collapse)
        for r in result.sweep.runs
    ]
    assert choose_lr(runs) == (result.sweep.chosen_lr, result.sweep.reason)
    assert [r.unstable for r in runs] == [r.unstable for r in result.sweep.runs]
