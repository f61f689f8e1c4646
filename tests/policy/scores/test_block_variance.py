"""Per-block variance of `full` mode: the blocks' variances sum to the total, and the projection
error read from sub-sketches."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
import torch
from test_full_engines import gpt2

from otb_diag.maths.response_batch import ResponseBatch
from otb_diag.maths.returns import returns_to_go
from otb_diag.maths.variance.blocks import block_tables, projection_error, subsketch_coordinates
from otb_diag.maths.variance.paired_draws import paired_estimates, variance_table
from otb_diag.pipelines.results.variance import plus_minus
from otb_diag.policy.scores.token_scores import token_scores


def paired_of(scores, batch):
    returns = returns_to_go(batch.token_rewards, batch.mask)
    return paired_estimates(
        returns, batch.mask, batch.group, scores.proj, {"proxy": scores.sq_norm},
        aggregations=("token-sum",), group_sizes=(2,), draws=30, bootstrap=50, seed=0,
        mode="full",
    )  # fmt: skip


def pooled_batch():
    """Two prompts with pools of 4 responses (rewards mixed), from the tiny prompts/responses."""
    from otb_diag.maths.response_batch import ResponseBatch, pad

    prompts = [[1, 2], [3]] * 4
    responses = [[4, 5, 6], [7, 8], [9, 10, 11, 12], [5], [6, 7], [8, 9, 10], [11], [12, 4]]
    n, length = len(responses), torch.tensor([len(r) for r in responses])
    width = int(length.max())
    valid = torch.arange(width)[None] < length[:, None]
    reward = torch.tensor([1.0, 0, 0, 1, 1, 0, 1, 0])
    rewards = torch.zeros(n, width)
    rewards[torch.arange(n), length - 1] = reward
    return ResponseBatch(
        group_names=["a", "b"], group=torch.tensor([0, 1] * 4), sample=torch.arange(n),
        length=length, prompt_ids=prompts, response_ids=pad(responses, width, 0, torch.long),
        valid=valid, mask=valid.float(), token_rewards=rewards, reward=reward,
        temperature=torch.ones(n), step=[None] * n, is_weights=None, logprobs=None, sum_pi2=None,
    )  # fmt: skip


def test_block_variances_sum_to_the_total() -> None:
    """tr Cov(ĝ) = Σ_b tr Cov(ĝ_b) (theory.md §4), on the same draws."""
    model, batch = gpt2(), pooled_batch()
    scores = token_scores(model, batch, "full", 12, seed=0, engine="vjp", by_block=True)
    paired = paired_of(scores, batch)
    total = variance_table(paired).set_index(["baseline", "group_size"])["variance"]
    blocks = block_tables(paired, scores.blocks)
    assert list(blocks["block"].unique()) == [
        "embeddings",
        "layer.0",
        "layer.1",
        "final_norm",
        "head",
    ]
    summed = blocks.groupby(["baseline", "group_size"])["variance"].sum()
    np.testing.assert_allclose(summed.loc[total.index], total, rtol=1e-10)
    assert (blocks.loc[blocks["baseline"] == "mean", "ratio_to_mean"] == 1).all()


def test_projection_error_from_subsketches() -> None:
    blocks = [("a", 0, 8), ("b", 8, 8)]
    subsets = subsketch_coordinates(blocks, 4)
    assert sorted(np.concatenate(subsets).tolist()) == list(range(16))
    assert [s.tolist() for s in subsets][:2] == [[0, 4, 8, 12], [1, 5, 9, 13]]
    model, batch = gpt2(), pooled_batch()
    scores = token_scores(model, batch, "full", 64, seed=0, engine="vjp")
    err = projection_error(paired_of(scores, batch), scores.blocks)
    assert err["k"] == 64 and err["subsketches"] == 8
    assert err["theory_worst_case"] == pytest.approx(math.sqrt(2 / 64))
    # a projection error, bounded by its rank-one worst case (with room for the estimate's own
    # noise from 8 sub-sketches) and not zero
    assert 0 < err["variance_relative_error"] < 2 * err["theory_worst_case"]
    assert projection_error(paired_of(scores, batch), [("all", 0, 3)]) == {}
    # every reward equal: no variance above 0, so no error to measure (NaN, said in words)
    flat = ResponseBatch(**{**vars(batch), "token_rewards": torch.zeros_like(batch.token_rewards)})
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # np.median of nothing warned before
        none = projection_error(paired_of(scores, flat), scores.blocks)
    assert math.isnan(none["variance_relative_error"]) and math.isnan(none["ratio_relative_error"])
    assert plus_minus(none["variance_relative_error"]) == "not measurable (no variance above 0)"
    assert plus_minus(0.0876) == "±8.8%"
