"""`compute_otb_metrics` against verl's own code (verl 0.9.1, installed in the dev environment
with `pip install --no-deps verl==0.9.1 tensordict==0.10.0` plus ray, omegaconf, codetiming):
a real `DataProto` sampled at τ = 0.7 holding one aborted generation (a row kept with an
all-zero response mask), advantages from verl's own OTB and GRPO functions, and verl's
`compute_variance_proxy_metrics` on it. Under verl's names the logged numbers are verl's (its
`w = 1 − 2p + Σπ²` of the tempered logits, its mean over every row, the empty one included);
under our names ours (the raw logits' `w`, that over τ²)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from otb_diag.integrations.verl.adapter import compute_otb_metrics
from otb_diag.maths.energy.token_stats import stats_from_logits

pytest.importorskip("verl", reason="verl (0.9.1, with tensordict, ray, omegaconf) is not installed")
from verl import DataProto  # noqa: E402
from verl.trainer.ppo.core_algos import (  # noqa: E402
    compute_grpo_outcome_advantage,
    compute_optimal_token_baseline_advantage,
)
from verl.trainer.ppo.metric_utils import compute_variance_proxy_metrics  # noqa: E402

pytestmark = pytest.mark.verl

TAU = 0.7
GROUPS, N, T, P, V = 4, 4, 6, 3, 13
EMPTY = 5  # the aborted generation: row 5, of group 1


def verl_batch_at(adv_estimator: str, seed: int = 0) -> DataProto:
    """A step's `DataProto` as verl's trainer holds it after `compute_advantage`, sampled at τ,
    row `EMPTY` with no response token (attention and response mask 0, rewards 0)."""
    g = torch.Generator().manual_seed(seed)
    b = GROUPS * N
    lengths = torch.randint(2, T + 1, (b,), generator=g)
    lengths[EMPTY] = 0
    response_mask = (torch.arange(T)[None, :] < lengths[:, None]).float()
    responses = torch.randint(3, V, (b, T), generator=g) * response_mask.long()
    stats = stats_from_logits(3 * torch.randn(b, T, V, generator=g), responses, TAU)
    rewards = torch.zeros(b, T)
    last = (lengths - 1).clamp_min(0)
    rewards[torch.arange(b), last] = torch.randint(0, 2, (b,), generator=g).float() * (lengths > 0)
    uid = np.array([f"prompt-{i % GROUPS}" for i in range(b)], dtype=object)
    prompts = torch.randint(3, V, (b, P), generator=g)
    old_log_probs = stats.logprob * response_mask  # tempered: what verl's actor logs at τ
    sum_pi_squared = stats.sum_pi2 * response_mask
    if adv_estimator == "optimal_token_baseline":
        advantages, _ = compute_optimal_token_baseline_advantage(
            rewards, response_mask, uid, old_log_probs, sum_pi_squared
        )
    else:
        advantages, _ = compute_grpo_outcome_advantage(rewards, response_mask, uid)
    tensors = {
        "responses": responses,
        "response_mask": response_mask,
        "attention_mask": torch.cat([torch.ones(b, P, dtype=torch.long), response_mask.long()], 1),
        "prompts": prompts,
        "old_log_probs": old_log_probs,
        "sum_pi_squared": sum_pi_squared,
        "token_level_rewards": rewards,
        "advantages": advantages,
    }
    return DataProto.from_dict(tensors, non_tensors={"uid": uid}, meta_info={"temperature": TAU})


@pytest.mark.parametrize("estimator", ["optimal_token_baseline", "grpo"])
def test_verl_names_carry_verls_numbers_at_temperature_with_an_empty_row(estimator: str) -> None:
    batch = verl_batch_at(estimator)
    ours = compute_otb_metrics(batch, adv_estimator=estimator)
    theirs = compute_variance_proxy_metrics(batch)
    # The trainer's advantages, the empty row's group of 4 included, are the registry's.
    assert ours["otb/audit/agrees"] == 1.0, ours["otb/audit/max_abs_diff"]
    b = "otb" if estimator == "optimal_token_baseline" else "grpo"
    for name in ("proxy2_total_power", "expected_a_squared"):
        assert ours[f"otb/proxy/{b}/{name}"] == pytest.approx(
            theirs[f"variance_proxy/{name}"], rel=1e-5
        ), name
    assert ours["otb/proxy/expected_w"] == pytest.approx(
        theirs["variance_proxy/expected_w"], rel=1e-5
    )
    # Ours: the raw logits' w = verl's / τ², so the proxy over τ² (2.0408 at τ = 0.7).
    assert ours[f"otb/proxy/{b}/logit_total_power"] == pytest.approx(
        theirs["variance_proxy/proxy2_total_power"] / TAU**2, rel=1e-5
    )
    assert ours["otb/groups/empty_responses"] == 1.0


def test_the_empty_row_counts_as_verl_counts_it() -> None:
    """verl averages over all 16 rows, the empty one (Ā = 0, W = 0) included: leaving it out
    would log 16/15 of verl's number."""
    batch = verl_batch_at("optimal_token_baseline", seed=1)
    theirs = compute_variance_proxy_metrics(batch)["variance_proxy/proxy2_total_power"]
    ours = compute_otb_metrics(batch, adv_estimator=None)["otb/proxy/otb/proxy2_total_power"]
    assert ours == pytest.approx(theirs, rel=1e-5)
    assert ours != pytest.approx(theirs * 16 / 15, rel=1e-3)
