"""The live log carries OTB's zero-tail split and the empty responses (issue 34): verl's step
batch of `zero_tail_step.py` (two all-correct groups, one aborted generation) through
`compute_otb_metrics` gives the numbers `energy --model-free` prints on the dumped batch, and the
dump with its empty row reads back."""

from __future__ import annotations

import json
import math
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
import torch
from zero_tail_step import dumped_step

from otb_diag.integrations.verl.adapter import compute_otb_metrics, dump_batch
from otb_diag.pipelines.energy.recipe import run_energy
from otb_diag.pipelines.inputs import EnergyInputs
from otb_diag.plots.dynamics import LIVE_PANELS, LIVE_WITHOUT_TAIL, fig_live_otb


def verl_fields(rows: list[dict]) -> dict:
    """The rows as verl's step batch: right-padded responses, rewards on the last token, an
    aborted generation as a row with an all-zero response mask."""
    b, width = len(rows), max(1, *(len(r["response_ids"]) for r in rows))
    mask = torch.zeros(b, width)
    fields = {k: torch.zeros(b, width) for k in ("old_log_probs", "sum_pi_squared")}
    rewards = torch.zeros(b, width)
    for i, r in enumerate(rows):
        n = len(r["response_ids"])
        mask[i, :n] = 1
        fields["old_log_probs"][i, :n] = torch.tensor(r["logprobs"])
        fields["sum_pi_squared"][i, :n] = torch.tensor(r["sum_pi2"])
        if n:
            rewards[i, n - 1] = r["reward"]
    prompts = torch.tensor([r["prompt_ids"] for r in rows])
    return {
        "responses": 7 * mask.long(),
        "response_mask": mask,
        "attention_mask": torch.cat([torch.ones_like(prompts), mask.long()], 1),
        "prompts": prompts,
        "token_level_rewards": rewards,
        "uid": np.array([r["group"] for r in rows], dtype=object),
        **fields,
    }


@pytest.mark.slow  # runs a command end to end (a real run: seconds)
def test_live_metrics_carry_the_zero_tail_split_as_energy_prints_it(tmp_path: Path) -> None:
    rows = [json.loads(line) for line in dumped_step(tmp_path / "fixture.jsonl").open()]
    fields = verl_fields(rows)
    live = compute_otb_metrics(fields, adv_estimator=None, temperature=1.0)
    assert live["otb/groups/empty_responses"] == 1.0
    dumped = dump_batch(fields, tmp_path / "dumps", step=22)  # the empty row is written
    energy = run_energy(
        EnergyInputs(model_free=True, rollouts=dumped), tmp_path / "e", progress=False
    )
    assert energy is not None and energy.totals.empty_responses == 1
    otb, mean = energy.proxies["otb"], energy.proxies["mean"]
    for p in ("proxy2_total_power", "token_total_power"):
        tail = otb[f"zero_tail/{p}"]
        assert tail > 0
        assert live[f"otb/proxy/otb/zero_tail/{p}"] == pytest.approx(tail, rel=1e-6)
        assert live[f"otb/otb_over_mean/{p}"] == pytest.approx(otb[p] / mean[p], rel=1e-6)
        without = live[f"otb/otb_over_mean/without_zero_tail/{p}"]
        assert without == pytest.approx((otb[p] - tail) / mean[p], rel=1e-6)
    # The tail lifts OTB above the mean baseline on this step; without it OTB is below.
    assert live["otb/otb_over_mean/proxy2_total_power"] > 1.0
    assert live["otb/otb_over_mean/without_zero_tail/proxy2_total_power"] < 1.0
    assert math.isclose(live["otb/groups/mixed_rewards_fraction"], 1 / 3)


@pytest.mark.slow  # runs a command end to end (a real run: seconds)
def test_a_step_whose_every_generation_was_aborted_is_logged_and_read_back(tmp_path: Path) -> None:
    rows = [json.loads(line) for line in dumped_step(tmp_path / "fixture.jsonl").open()]
    for r in rows:
        r.update(response_ids=[], logprobs=[], sum_pi2=[], reward=0.0)
    fields = verl_fields(rows)
    live = compute_otb_metrics(fields, adv_estimator=None, temperature=1.0)
    assert live["otb/groups/empty_responses"] == 12.0
    assert live["otb/proxy/otb/proxy2_total_power"] == 0.0
    assert live["otb/energy/sequence_mean"] == 0.0
    dumped = dump_batch(fields, tmp_path / "dumps", step=1)
    energy = run_energy(
        EnergyInputs(model_free=True, rollouts=dumped), tmp_path / "e", progress=False
    )
    assert energy is not None and energy.totals.empty_responses == 12
    assert energy.totals.generated_tokens == 0
    assert "12 responses with no generated token" in energy.format()


def test_the_live_figure_draws_otb_over_mean_with_and_without_the_zero_tail() -> None:
    """The OTB/mean panel: the logged ratio as the run's line, the ratio without the tail's
    part as × where it differs (step 1's tail moves nothing: no mark, nothing promised there),
    and a note on the marks and on the gap of step 4 (no ratio: every group's rewards equal)."""
    steps = np.arange(1, 6)
    with_tail = np.array([0.4, 0.6, 1.9, np.nan, 2.2])
    without = np.array([0.4, 0.5, 0.3, np.nan, 0.21])
    table = pd.DataFrame(
        {
            "run": "trl",
            "step": steps,
            "grad_norm": 1.0 + steps,
            "baseline": "grpo",
            "group_size": 4,
            "otb/otb_over_mean/proxy2_total_power": with_tail,
            "otb/otb_over_mean/without_zero_tail/proxy2_total_power": without,
        }
    )
    runs = [SimpleNamespace(run="trl", collapse_step=None)]
    fig = fig_live_otb(table, runs)
    (column,) = LIVE_WITHOUT_TAIL
    panel = fig.axes[1 + [p.key for p in LIVE_PANELS].index(column)]
    (line,) = [x for x in panel.get_lines() if len(x.get_xdata()) == len(steps)]
    np.testing.assert_array_equal(line.get_ydata(), with_tail)
    (crosses,) = [x for x in panel.get_lines() if x.get_marker() == "x"]
    np.testing.assert_array_equal(crosses.get_xydata(), [[2, 0.5], [3, 0.3], [5, 0.21]])
    (note,) = [t.get_text().replace("\n", " ") for t in panel.texts]
    assert "×: without verl's zero tail (3 step(s) it moves)" in note
    assert "gaps: 1 step(s) with equal rewards in every group (no ratio)" in note
    assert "dashed" not in panel.get_ylabel()
