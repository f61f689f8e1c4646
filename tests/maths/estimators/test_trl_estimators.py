"""TRL 1.16's `scale_rewards` as registry estimators (`grpo-unscaled`: "none", `grpo-batch`:
"batch"): bit for bit TRL's own lines of `GRPOTrainer._generate_and_score_completions`, run
here with TRL's own `nanstd`, over group sizes where another summation order differs in the last
bit (16, 64); by hand on one batch; and which trainer setting names which entry."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from otb_diag.maths.estimators.baselines import trl_group_mean
from otb_diag.maths.estimators.registry import get_baseline, trainer_baseline
from otb_diag.maths.groups import block_size

trl_utils = pytest.importorskip("trl.trainer.utils")


def trl_advantages(rewards: torch.Tensor, n: int, scale_rewards: str) -> torch.Tensor:
    """TRL 1.16's lines (`sum_then_normalize`), copied in their order, with its `nanstd`."""
    mean_grouped_rewards = torch.nanmean(rewards.view(-1, n), dim=1)
    mean_grouped_rewards = mean_grouped_rewards.repeat_interleave(n, dim=0)
    if scale_rewards == "batch":
        std_rewards = trl_utils.nanstd(rewards).expand_as(rewards)
    advantages = rewards - mean_grouped_rewards
    if scale_rewards != "none":
        advantages = advantages / (std_rewards + 1e-4)
    return advantages


def registry_advantages(rewards: torch.Tensor, n: int, name: str) -> torch.Tensor:
    """The registry entry on `[B, T]` returns (R on every token, as `returns_to_go` gives an
    outcome reward), TRL's options, on every token of a mask of ones: `[B, T]`."""
    returns = rewards[:, None].expand(-1, 3).clone()  # a column of [B, T], not contiguous
    group = torch.arange(len(rewards)) // n
    entry, options = get_baseline(name), {"none": {}, "batch": {"eps": 1e-4}}
    setting = {"grpo-unscaled": "none", "grpo-batch": "batch"}[name]
    return entry(returns, torch.ones_like(returns), group, None, **options[setting])


rewards_of = st.tuples(
    st.sampled_from([2, 4, 8, 16, 64]),  # TRL's num_generations
    st.integers(1, 4),  # prompts
    st.integers(0, 2**31 - 1),
    st.booleans(),  # graded rewards, or TRL's typical sums of 0/1 and 0.1 functions
)


def draw(params: tuple[int, int, int, bool]) -> tuple[torch.Tensor, int]:
    n, prompts, seed, graded = params
    gen = torch.Generator().manual_seed(seed)
    if graded:
        return torch.rand(n * prompts, generator=gen) * 3 - 1, n
    hits = torch.randint(0, 2, (n * prompts,), generator=gen).float()
    return hits + 0.1 * torch.randint(0, 2, (n * prompts,), generator=gen).float(), n


@settings(max_examples=80, deadline=None)
@given(rewards_of, st.sampled_from(["grpo-unscaled", "grpo-batch"]))
def test_the_registry_is_trls_own_arithmetic(params, name) -> None:
    """Every token's advantage is TRL's, bit for bit (`torch.equal`): the audit's max |δ| on a
    CPU trainer is 0."""
    rewards, n = draw(params)
    setting = {"grpo-unscaled": "none", "grpo-batch": "batch"}[name]
    want = trl_advantages(rewards, n, setting)
    got = registry_advantages(rewards, n, name)
    assert torch.equal(got, want[:, None].expand_as(got))


def test_groups_of_sixteen_need_trls_order() -> None:
    """Why the entries sum as TRL does: segment sums (the registry's `mean`) differ from TRL's
    `nanmean` in the last bit on most batches of groups of 16 (the audit would then report
    ulps, not 0); in exact arithmetic the two are one estimator."""
    rewards, n = draw((16, 4, 7, True))
    group = torch.arange(len(rewards)) // n
    mean = get_baseline("mean")(rewards[:, None], torch.ones(len(rewards), 1), group, None)[:, 0]
    trl = trl_advantages(rewards, n, "none")
    assert not torch.equal(mean, trl)
    torch.testing.assert_close(mean, trl, rtol=0, atol=1e-6)


def test_a_hand_batch() -> None:
    """Two groups of two: rewards (1, 0 | 3, 3). Group means 0.5 and 3. The batch's unbiased
    std: mean 1.75, squares 0.5625 + 3.0625 + 1.5625 + 1.5625 = 6.75, /3 = 2.25, std 1.5."""
    rewards = torch.tensor([1.0, 0.0, 3.0, 3.0])
    unscaled = registry_advantages(rewards, 2, "grpo-unscaled")[:, 0]
    torch.testing.assert_close(unscaled, torch.tensor([0.5, -0.5, 0.0, 0.0]))
    batch = registry_advantages(rewards, 2, "grpo-batch")[:, 0]
    torch.testing.assert_close(batch, torch.tensor([0.5, -0.5, 0.0, 0.0]) / (1.5 + 1e-4))


def test_any_grouping_and_a_batch_of_one() -> None:
    """Groups that are not consecutive blocks get segment sums (the same means to round-off);
    a group of one is its own mean (TRL: advantage 0), a batch of one has std 0 (TRL)."""
    rewards, group = torch.tensor([1.0, 3.0, 0.0, 3.0, 5.0]), torch.tensor([0, 1, 0, 1, 2])
    assert block_size(group) is None and block_size(torch.tensor([0, 0, 1, 1])) == 2
    torch.testing.assert_close(trl_group_mean(rewards, group), torch.tensor([0.5, 3, 0.5, 3, 5]))
    one = get_baseline("grpo-batch")(torch.tensor([[2.0]]), torch.ones(1, 1), group[:1], None)
    assert one.item() == 0.0


def test_each_setting_names_its_entry() -> None:
    """What the TRL adapter reads (`support.py`): `trl-none`, `trl-batch` beside `trl`; neither
    is in the commands' defaults."""
    assert trainer_baseline("trl-none") == ("grpo-unscaled", {})
    assert trainer_baseline("trl-batch") == ("grpo-batch", {"eps": 1e-4})
    assert not get_baseline("grpo-unscaled").default and not get_baseline("grpo-batch").default
