"""`energy --model-free` on a dumped step with all-correct groups and an aborted generation:
OTB's proxies split into verl's zero tail and the rest, the note when the tail lifts OTB above
the mean baseline, and the empty response kept, counted and named (issue 34)."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
from zero_tail_step import LONGEST, SECOND, W_BODY, W_TAIL, dumped_step

from otb_diag.pipelines.energy.recipe import run_energy
from otb_diag.pipelines.inputs import EnergyInputs
from otb_diag.pipelines.regress.run_metrics import find_runs
from otb_diag.pipelines.report.sections import Run, energy_tables
from otb_diag.pipelines.report.verdicts import energy_verdicts


@pytest.mark.slow  # runs a command end to end (a real run: seconds)
def test_energy_splits_otbs_proxy_at_the_zero_tail_and_counts_the_empty_response(
    tmp_path: Path,
) -> None:
    rollouts = dumped_step(tmp_path / "step_000022.jsonl")
    out = tmp_path / "energy"
    result = run_energy(EnergyInputs(rollouts=rollouts, model_free=True), out, progress=False)
    assert result is not None
    rows = 12  # every response counts in the proxies' means, the empty one included (verl)
    otb, mean = result.proxies["otb"], result.proxies["mean"]
    # In an all-correct group OTB's baseline is R wherever two members generate (A ≈ 0); the
    # tail gives the longest A = R = 1 on its 3 tail tokens: Σ_t w_t A_t² = 3·1.1 per group.
    tail_power = 2 * (LONGEST - SECOND) * W_TAIL / rows
    assert otb["zero_tail/token_total_power"] == pytest.approx(tail_power, rel=1e-5)
    # proxy2: that member's Ā = 3/6, its W = 3·0.4 + 3·1.1.
    w_longest = SECOND * W_BODY + (LONGEST - SECOND) * W_TAIL
    tail_proxy2 = 2 * 0.5**2 * w_longest / rows
    assert otb["zero_tail/proxy2_total_power"] == pytest.approx(tail_proxy2, rel=1e-5)
    # The mean baseline gives 0 in the all-correct groups; in the mixed one the empty member
    # keeps its size 4 (baseline 2/4): A = ±1/2 on its three other members.
    mixed_power = 0.25 * (2 * W_BODY + 2 * 4 * W_BODY) / rows
    assert mean["proxy2_total_power"] == pytest.approx(mixed_power, rel=1e-5)
    # OTB's rest (the mixed group) is below the mean baseline's, the tail lifts it above.
    rest = otb["proxy2_total_power"] - otb["zero_tail/proxy2_total_power"]
    assert rest < mean["proxy2_total_power"] < otb["proxy2_total_power"]

    text = result.format()
    with_tail = otb["proxy2_total_power"] / mean["proxy2_total_power"]
    without = rest / mean["proxy2_total_power"]
    assert f"OTB/mean {with_tail:.3g} with verl's zero tail, {without:.3g} without" in text
    assert "zero tail    OTB proxy2_total_power" in text
    assert "2 of 3 groups (67%) have all-equal rewards" in text
    assert "6 tokens in the tail" in text and result.energy.zero_tail_tokens == 6
    assert result.totals.empty_responses == 1
    assert result.totals.groups_with_empty_responses == ["mixed"]
    assert "1 response with no generated token" in text and ": mixed" in text

    groups = pd.read_csv(out / "groups.csv").set_index("group")
    assert groups["size"].tolist() == [4, 4, 4]
    assert groups["empty_responses"].tolist() == [0, 0, 1]
    assert groups["zero_tail_tokens"].tolist() == [3, 3, 0]
    written = json.loads((out / "proxies.json").read_text())
    assert written["otb"]["zero_tail/proxy2_total_power"] == otb["zero_tail/proxy2_total_power"]


@pytest.mark.slow  # runs a command end to end (a real run: seconds)
def test_without_the_zero_tail_otbs_tail_part_is_zero(tmp_path: Path) -> None:
    from otb_diag.pipelines.energy.settings import EnergySettings

    rollouts = dumped_step(tmp_path / "step.jsonl")
    settings = EnergySettings(handle_zero_tail=False)
    result = run_energy(
        EnergyInputs(rollouts=rollouts, model_free=True), tmp_path / "e", settings, progress=False
    )
    assert result is not None
    assert result.proxies["otb"]["zero_tail/proxy2_total_power"] == 0.0
    assert result.energy.zero_tail_tokens == 0
    assert "OTB/mean" not in result.format()


@pytest.mark.slow  # runs a command end to end (a real run: seconds)
def test_the_report_carries_the_split_the_note_and_the_empty_responses(tmp_path: Path) -> None:
    out = tmp_path / "energy"
    given = EnergyInputs(rollouts=dumped_step(tmp_path / "s.jsonl"), model_free=True)
    run_energy(given, out, progress=False)
    ((_, _, result),) = find_runs(out)  # summary.json read back, as `report` reads it
    (verdict,) = energy_verdicts(result, "step 22")
    otb, mean = result.proxies["otb"], result.proxies["mean"]
    ratio = otb["proxy2_total_power"] / mean["proxy2_total_power"]
    assert f"OTB/mean {ratio:.3g} with verl's zero tail" in verdict.sentence
    assert "1 responses have no generated token" in verdict.sentence
    assert "in 1 groups: mixed." in verdict.sentence
    run = Run(out, "energy", result, "step 22", tmp_path)
    table = energy_tables(run)
    assert "zero_tail/proxy2_total_power" in table and "logit_total_power" in table
