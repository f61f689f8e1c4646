"""The live log carries OTB's zero-tail split and the empty responses (issue 34): verl's step
batch of `zero_tail_step.py` (two all-correct groups, one aborted generation) through
`compute_otb_metrics` gives the numbers `energy --model-free` prints on the dumped batch, and the
dump with its empty row reads back."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from zero_tail_step import dumped_step

from otb_diag.integrations.verl import compute_otb_metrics, dump_batch
from otb_diag.pipelines.energy.recipe import run_energy
from otb_diag.pipelines.inputs import Inputs


def verl_fields(rows: list[dict]) -> dict:
    """The rows as verl's step batch: right-padded responses, rewards on the last token, an
    aborted generation as a row with an all-zero response mask."""
    b, width = len(rows), max(len(r["response_ids"]) for r in rows)
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


def test_live_metrics_carry_the_zero_tail_split_as_energy_prints_it(tmp_path: Path) -> None:
    rows = [json.loads(line) for line in dumped_step(tmp_path / "fixture.jsonl").open()]
    fields = verl_fields(rows)
    live = compute_otb_metrics(fields, adv_estimator=None, temperature=1.0)
    assert live["otb/groups/empty_responses"] == 1.0
    dumped = dump_batch(fields, tmp_path / "dumps", step=22)  # the empty row is written
    energy = run_energy(Inputs(rollouts=dumped), tmp_path / "e", model_free=True, progress=False)
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
