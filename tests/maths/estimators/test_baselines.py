"""Baselines: hand-computed cases, verl conventions, properties against plain loop references."""

from __future__ import annotations

from collections import defaultdict

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from otb_diag.errors import InputError
from otb_diag.maths.energy.token_stats import cumulative_energy
from otb_diag.maths.estimators.otb import verl_otb_advantage
from otb_diag.maths.estimators.registry import BASELINES, get_baseline, register_baseline
from otb_diag.maths.returns import group_index, outcome_token_rewards, returns_to_go

F64 = torch.float64

ENERGY_BASELINES = ["optseq", "optseq-loo", "otb", "otb-loo"]


def t(rows):
    return torch.tensor(rows, dtype=torch.float64)


# ---------------------------------------------------------------------------------------------
# The hand case: one group of three sequences of lengths 3, 2, 1
#   a: R = 1, w = [1, 1, 2] -> W = [1, 2, 4]
#   b: R = 0, w = [2, 1]    -> W = [2, 3]
#   c: R = 2, w = [1]       -> W = [1]
# ---------------------------------------------------------------------------------------------

MASK = t([[1, 1, 1], [1, 1, 0], [1, 0, 0]])
W_TOKENS = t([[1, 1, 2], [2, 1, 0], [1, 0, 0]])
REWARD = t([1, 0, 2])
GROUP = torch.tensor([0, 0, 0])


def hand_inputs():
    returns = returns_to_go(outcome_token_rewards(REWARD, MASK), MASK)
    return returns, MASK, GROUP, cumulative_energy(W_TOKENS, MASK)


def test_returns_and_energy_of_the_hand_case():
    returns, _, _, energy = hand_inputs()
    # G_t = sum_{k>=t} r_k: c's reward sits on its only token, so G is 0 after it.
    torch.testing.assert_close(returns, t([[1, 1, 1], [0, 0, 0], [2, 0, 0]]))
    # W is defined on the whole row: it stays flat after the last generated token.
    torch.testing.assert_close(energy, t([[1, 2, 4], [2, 3, 3], [1, 1, 1]]))


def test_otb_hand_case_with_zero_tail():
    # t=0, all three: B = (1*1 + 0*2 + 2*1) / (1 + 2 + 1) = 3/4
    # t=1, a and b:   B = (1*2 + 0*3) / (2 + 3) = 2/5
    # t=2, a alone, and a is strictly longest (3 > 2): zero tail, B = 0
    expected = t(
        [
            [1 - 0.75, 1 - 0.4, 1 - 0.0],
            [0 - 0.75, 0 - 0.4, 0.0],
            [2 - 0.75, 0.0, 0.0],
        ]
    )
    torch.testing.assert_close(get_baseline("otb")(*hand_inputs()), expected)


def test_otb_hand_case_without_zero_tail():
    # t=2: a alone is its own baseline, B = 1*4 / (4 + 1e-8), so its advantage vanishes.
    advantages = get_baseline("otb")(*hand_inputs(), handle_zero_tail=False)
    torch.testing.assert_close(advantages[0, 2], torch.tensor(1 - 4 / (4 + 1e-8), dtype=F64))
    torch.testing.assert_close(advantages[:, :2], t([[0.25, 0.6], [-0.75, -0.4], [1.25, 0.0]]))


def test_zero_tail_needs_a_unique_longest_member():
    # Lengths 3, 3, 1: no strictly longest member, so t=2 keeps B = (1*4 + 0*4)/(4 + 4) = 1/2.
    mask = t([[1, 1, 1], [1, 1, 1], [1, 0, 0]])
    w = t([[1, 1, 2], [2, 1, 1], [1, 0, 0]])
    returns = returns_to_go(outcome_token_rewards(REWARD, mask), mask)
    advantages = get_baseline("otb")(returns, mask, GROUP, cumulative_energy(w, mask))
    torch.testing.assert_close(advantages[:2, 2], t([0.5, -0.5]))


def test_otb_loo_hand_case():
    # t=0: a <- (0*2 + 2*1)/(2 + 1) = 2/3,  b <- (1*1 + 2*1)/(1 + 1) = 3/2,
    #      c <- (1*1 + 0*2)/(1 + 2) = 1/3
    # t=1: a <- b alone: 0*3/3 = 0,  b <- a alone: 1*2/2 = 1
    # t=2: a has nobody left: B = 0
    expected = t([[1 - 2 / 3, 1.0, 1.0], [-1.5, -1.0, 0.0], [2 - 1 / 3, 0.0, 0.0]])
    torch.testing.assert_close(get_baseline("otb-loo")(*hand_inputs()), expected)
    # Without the eps guard, "nobody left" must still give B = 0 rather than 0/0.
    torch.testing.assert_close(get_baseline("otb-loo")(*hand_inputs(), eps=0.0), expected)


def test_optseq_hand_case():
    # W(tau) = [4, 3, 1]; B = (1*4 + 0*3 + 2*1) / (4 + 3 + 1) = 6/8 for everyone
    returns, mask, group, energy = hand_inputs()
    torch.testing.assert_close(
        get_baseline("optseq")(returns, mask, group, energy), (returns - 0.75) * mask
    )
    # A per-sequence energy [B] works the same way.
    torch.testing.assert_close(
        get_baseline("optseq")(returns, mask, group, t([4, 3, 1])), (returns - 0.75) * mask
    )
    # Leave one out: a <- (0*3 + 2*1)/(3 + 1), b <- (1*4 + 2*1)/(4 + 1), c <- (1*4 + 0*3)/(4 + 3)
    loo = t([0.5, 1.2, 4 / 7])
    torch.testing.assert_close(
        get_baseline("optseq-loo")(returns, mask, group, energy), (returns - loo[:, None]) * mask
    )


def test_mean_rloo_and_grpo_hand_case():
    returns, mask, group, energy = hand_inputs()
    # mean: (1 + 0 + 2)/3 = 1; rloo: a <- (0+2)/2, b <- (1+2)/2, c <- (1+0)/2
    torch.testing.assert_close(
        get_baseline("mean")(returns, mask, group, None), (returns - 1) * mask
    )
    rloo = t([1.0, 1.5, 0.5])
    torch.testing.assert_close(
        get_baseline("rloo")(returns, mask, group, None), (returns - rloo[:, None]) * mask
    )
    # grpo: unbiased std of [1, 0, 2] is 1, so A = (R - 1)/(1 + 1e-6)
    grpo = (REWARD - 1) / (1 + 1e-6)
    torch.testing.assert_close(
        get_baseline("grpo")(returns, mask, group, None), grpo[:, None] * mask
    )


def test_grpo_uses_the_unbiased_std():
    # R = [1, 0, 0, 1]: mean 1/2, unbiased std sqrt(4 * 1/4 / 3) = sqrt(1/3)
    reward = t([1, 0, 0, 1])
    mask = torch.ones(4, 2, dtype=F64)
    returns = returns_to_go(outcome_token_rewards(reward, mask), mask)
    advantages = get_baseline("grpo")(returns, mask, torch.zeros(4, dtype=torch.long), None)
    expected = (reward - 0.5) / (3**-0.5 + 1e-6)
    torch.testing.assert_close(advantages, expected[:, None].expand(4, 2))


def test_groups_of_one():
    # Rows 0 and 1 share group 0; row 2 is alone in group 1.
    mask = t([[1, 1], [1, 0], [1, 1]])
    returns = returns_to_go(outcome_token_rewards(t([1, 0, 3]), mask), mask)
    energy = cumulative_energy(t([[1, 2], [1, 1], [2, 2]]), mask)
    group = torch.tensor([0, 0, 1])
    for name in ["mean", "rloo", *ENERGY_BASELINES]:
        advantages = get_baseline(name)(returns, mask, group, energy)
        torch.testing.assert_close(advantages[2], t([3, 3]), msg=name)  # B = 0
    # verl's GRPO: mean 0, std 1 for a group of one
    grpo = get_baseline("grpo")(returns, mask, group, None)
    torch.testing.assert_close(grpo[2], t([3, 3]) / (1 + 1e-6))


# ---------------------------------------------------------------------------------------------
# TIR: tool tokens (mask 0) in different places. Generated tokens carry the hand case:
#   a: mask [1,0,0,1,1], b: mask [1,0,1,0,0], c: mask [1,0,0,0,0]
# ---------------------------------------------------------------------------------------------

TIR_MASK = t([[1, 0, 0, 1, 1], [1, 0, 1, 0, 0], [1, 0, 0, 0, 0]])
TIR_W = t([[1, 9, 9, 1, 2], [2, 9, 1, 9, 9], [1, 9, 9, 9, 9]])  # 9s sit on tool tokens


def tir_inputs():
    returns = returns_to_go(outcome_token_rewards(REWARD, TIR_MASK), TIR_MASK)
    return returns, TIR_MASK, GROUP, cumulative_energy(TIR_W, TIR_MASK)


def test_tir_reindexes_by_generated_token_count():
    # Aligned by generated-token count, this is the hand case: same numbers, mapped back.
    expected = t(
        [
            [0.25, 0, 0, 0.6, 1.0],
            [-0.75, 0, -0.4, 0, 0],
            [1.25, 0, 0, 0, 0],
        ]
    )
    torch.testing.assert_close(get_baseline("otb")(*tir_inputs(), tir=True), expected)


def test_without_tir_tool_tokens_shift_the_time_axis():
    # Raw axis: t=2 has only b generating (B = 0*3/3 = 0, A = 0); a's tokens at t=3,4 are past
    # index L_2 = 2 (counts 3, 2, 1), so the zero tail gives B = 0 there: A = G = 1.
    expected = t(
        [
            [0.25, 0, 0, 1.0, 1.0],
            [-0.75, 0, 0, 0, 0],
            [1.25, 0, 0, 0, 0],
        ]
    )
    torch.testing.assert_close(get_baseline("otb")(*tir_inputs()), expected)


def test_tir_counts_only_nonempty_rows_in_the_group_size():
    # Group of a response and an empty row: TIR sees a group of one (B = 0, A = G);
    # single-turn counts two, so without the zero tail the lone member is its own baseline.
    mask = t([[1, 1], [0, 0]])
    returns = returns_to_go(outcome_token_rewards(t([1, 0]), mask), mask)
    energy = cumulative_energy(torch.ones(2, 2, dtype=F64), mask)
    otb = get_baseline("otb")
    args = (returns, mask, torch.zeros(2, dtype=torch.long), energy)
    torch.testing.assert_close(otb(*args, tir=True, handle_zero_tail=False)[0], t([1, 1]))
    assert otb(*args, handle_zero_tail=False)[0].abs().max() < 1e-8


# ---------------------------------------------------------------------------------------------
# Importance weights
# ---------------------------------------------------------------------------------------------


def test_importance_weights_act_as_w_rho_squared():
    returns, mask, group, energy = hand_inputs()
    rho = t([[1.0, 2.0, 0.5], [0.5, 1.5, 7.0], [3.0, 7.0, 7.0]])
    # W' = cumsum(w rho^2): a [1, 1+4, 5+0.5], b [0.5, 0.5+2.25], c [9]
    reweighted = t([[1, 5, 5.5], [0.5, 2.75, 2.75], [9, 9, 9]])
    for name in ENERGY_BASELINES:
        fn = get_baseline(name)
        with_rho = fn(returns, mask, group, energy, is_weights=rho)
        torch.testing.assert_close(with_rho, fn(returns, mask, group, reweighted), msg=name)
    # t=0 of otb by hand: (1*1 + 0*0.5 + 2*9) / (1 + 0.5 + 9) = 19/10.5
    otb = get_baseline("otb")(returns, mask, group, energy, is_weights=rho)
    torch.testing.assert_close(otb[0, 0], torch.tensor(1 - 19 / 10.5, dtype=F64))


# ---------------------------------------------------------------------------------------------
# Inputs and registry
# ---------------------------------------------------------------------------------------------


def test_outcome_rewards_and_returns_with_holes_and_empty_rows():
    mask = t([[1, 0, 1, 0], [0, 0, 0, 0], [1, 1, 1, 1]])
    rewards = outcome_token_rewards(t([5, 6, 7]), mask)
    torch.testing.assert_close(rewards, t([[0, 0, 5, 0], [0, 0, 0, 0], [0, 0, 0, 7]]))
    token_rewards = t([[1, 2, 3, 4], [1, 1, 1, 1], [1, 2, 3, 4]])
    # Rewards on mask-0 tokens are dropped: row 0 keeps r_0 = 1 and r_2 = 3.
    torch.testing.assert_close(
        returns_to_go(token_rewards, mask), t([[4, 3, 3, 0], [0, 0, 0, 0], [10, 9, 7, 4]])
    )


def test_registry():
    assert set(BASELINES) >= {"none", "mean", "grpo", "rloo", "optseq", "otb"}
    with pytest.raises(InputError, match="known baselines: .*otb"):
        get_baseline("nope")
    with pytest.raises(ValueError, match="already registered"):
        register_baseline("otb")(lambda *args: None)
    with pytest.raises(InputError, match="needs the realized energy"):
        get_baseline("otb")(*hand_inputs()[:3], None)


def test_group_index_maps_labels_to_dense_ids():
    torch.testing.assert_close(group_index(["b", "a", "b", "c"]), torch.tensor([1, 0, 1, 2]))


# ---------------------------------------------------------------------------------------------
# Random batches and plain references
# ---------------------------------------------------------------------------------------------


def random_batch(seed: int, rows: int, length: int, groups: int, contiguous: bool):
    """Rewards, mask, group, per-token w, log-probs, sum_pi2, rho: float64 on a fixed seed."""
    gen = torch.Generator().manual_seed(seed)
    if contiguous:
        lengths = torch.randint(0, length + 1, (rows,), generator=gen)
        mask = (torch.arange(length)[None, :] < lengths[:, None]).double()
    else:
        mask = (torch.rand(rows, length, generator=gen, dtype=F64) < 0.7).double()
    group = torch.randint(0, groups, (rows,), generator=gen)
    reward = torch.randint(0, 3, (rows,), generator=gen).double()
    log_probs = torch.rand(rows, length, generator=gen, dtype=F64).clamp_min(0.01).log()
    sum_pi2 = log_probs.exp() ** 2 + torch.rand(rows, length, generator=gen, dtype=F64) * 0.3
    rho = torch.rand(rows, length, generator=gen, dtype=F64) * 2
    return outcome_token_rewards(reward, mask), mask, group, log_probs, sum_pi2, rho


batches = st.tuples(
    st.integers(0, 2**31 - 1),
    st.integers(1, 8),
    st.integers(1, 6),
    st.integers(1, 3),
    st.booleans(),
)


def energy_of(batch):
    token_rewards, mask, group, log_probs, sum_pi2, _ = batch
    w = 1 - 2 * log_probs.exp() + sum_pi2
    return returns_to_go(token_rewards, mask), mask, group, cumulative_energy(w, mask)


def slow_otb_baseline(G, W, mask, group, *, eps=1e-8, zero_tail=True, counted=None):
    """B_t per row, one group at a time, one position at a time."""
    rows, length = G.shape
    counted = [True] * rows if counted is None else counted
    members = defaultdict(list)
    for i in range(rows):
        members[int(group[i])].append(i)
    baseline = torch.zeros(rows, length, dtype=F64)
    for rows_of_group in members.values():
        if sum(counted[i] for i in rows_of_group) < 2:
            continue
        for step in range(length):
            num = sum(G[j, step] * W[j, step] * mask[j, step] for j in rows_of_group)
            den = sum(W[j, step] * mask[j, step] for j in rows_of_group)
            for i in rows_of_group:
                baseline[i, step] = num / (den + eps)
        lengths = {i: int(mask[i].sum()) for i in rows_of_group if counted[i]}
        ordered = sorted(lengths.values())
        longest = [i for i, n in lengths.items() if n == ordered[-1]]
        if zero_tail and len(longest) == 1 and ordered[-1] > ordered[-2]:
            baseline[longest[0], ordered[-2] :] = 0.0
    return baseline


@settings(max_examples=60, deadline=None)
@given(batches)
def test_vectorised_otb_equals_a_loop_over_groups(params):
    returns, mask, group, energy = energy_of(random_batch(*params))
    for zero_tail in (True, False):
        expected = returns - slow_otb_baseline(returns, energy, mask, group, zero_tail=zero_tail)
        advantages = get_baseline("otb")(returns, mask, group, energy, handle_zero_tail=zero_tail)
        torch.testing.assert_close(advantages, expected * mask)


def verl_reference(token_rewards, mask, uids, log_probs, sum_pi2, rho, *, tir):
    """verl's OTB from its formulas, written as loops: w = 1 - 2 p + sum_pi2, w rho^2, W = cumsum
    over generated tokens, G = reverse cumsum of masked rewards; TIR aligns generated tokens."""
    rows, length = mask.shape
    w = (1 - 2 * log_probs.exp() + sum_pi2) * (1.0 if rho is None else rho**2)
    G = torch.zeros(rows, length, dtype=F64)
    W = torch.zeros(rows, length, dtype=F64)
    for i in range(rows):
        running = 0.0
        for step in range(length):
            running += float(w[i, step] * mask[i, step])
            W[i, step] = running
            G[i, step] = float((token_rewards[i, step:] * mask[i, step:]).sum())
    if not tir:
        baseline = slow_otb_baseline(G, W, mask, torch.as_tensor(uids))
        return (G - baseline) * mask
    # TIR: row i's k-th generated token goes to slot k; empty rows leave their group.
    slots = [[s for s in range(length) if mask[i, s] > 0] for i in range(rows)]
    width = max(len(s) for s in slots)
    Gc, Wc, Mc = (torch.zeros(rows, width, dtype=F64) for _ in range(3))
    for i, positions in enumerate(slots):
        for k, step in enumerate(positions):
            Gc[i, k], Wc[i, k], Mc[i, k] = G[i, step], W[i, step], 1.0
    counted = [len(s) > 0 for s in slots]
    baseline = slow_otb_baseline(Gc, Wc, Mc, torch.as_tensor(uids), counted=counted)
    advantages = torch.zeros(rows, length, dtype=F64)
    for i, positions in enumerate(slots):
        for k, step in enumerate(positions):
            advantages[i, step] = Gc[i, k] - baseline[i, k]
    return advantages


@settings(max_examples=60, deadline=None)
@given(batches, st.booleans(), st.booleans())
def test_verl_adapter_agrees_with_a_reference_from_verls_formulas(params, tir, use_rho):
    token_rewards, mask, group, log_probs, sum_pi2, rho = random_batch(*params)
    rho = rho if use_rho else None
    if tir and mask.sum() == 0:
        return  # verl's TIR variant needs one generated token in the batch
    uids = [f"prompt-{int(g)}" for g in group]
    index = group_index(uids)
    advantages, returns = verl_otb_advantage(
        token_rewards, mask, index, log_probs, sum_pi2, rollout_is_weights=rho, tir=tir
    )
    expected = verl_reference(token_rewards, mask, index, log_probs, sum_pi2, rho, tir=tir)
    torch.testing.assert_close(advantages, expected)
    torch.testing.assert_close(returns, returns_to_go(token_rewards, mask))


@settings(max_examples=40, deadline=None)
@given(batches, st.sampled_from(sorted(BASELINES)), st.booleans())
def test_advantages_vanish_where_mask_is_zero(params, name, tir):
    returns, mask, group, energy = energy_of(random_batch(*params))
    options = {"tir": tir} if name.startswith("otb") else {}
    advantages = get_baseline(name)(returns, mask, group, energy, **options)
    assert torch.all(advantages[mask == 0] == 0)


@settings(max_examples=40, deadline=None)
@given(batches, st.sampled_from(sorted(BASELINES)), st.integers(0, 2**31 - 1))
def test_permuting_rows_permutes_advantages(params, name, perm_seed):
    returns, mask, group, energy = energy_of(random_batch(*params))
    fn = get_baseline(name)
    perm = torch.randperm(len(group), generator=torch.Generator().manual_seed(perm_seed))
    permuted = fn(returns[perm], mask[perm], group[perm], energy[perm])
    torch.testing.assert_close(permuted, fn(returns, mask, group, energy)[perm])


@settings(max_examples=40, deadline=None)
@given(batches, st.sampled_from(["rloo", "optseq-loo", "otb-loo"]), st.integers(0, 2**31 - 1))
def test_leave_one_out_baselines_ignore_the_own_reward(params, name, row_seed):
    returns, mask, group, energy = energy_of(random_batch(*params))
    row = row_seed % len(group)
    changed = returns.clone()
    gen = torch.Generator().manual_seed(row_seed)
    changed[row] += torch.rand(returns.shape[1], generator=gen, dtype=F64)
    fn = get_baseline(name)
    # Where mask is 1, B = G - A; row `row`'s baseline must not move with its own return.
    before = (returns - fn(returns, mask, group, energy))[row] * mask[row]
    after = (changed - fn(changed, mask, group, energy))[row] * mask[row]
    torch.testing.assert_close(after, before)


@settings(max_examples=40, deadline=None)
@given(batches, st.floats(0.1, 10.0))
def test_otb_with_equal_energies_is_the_mean_over_active_members(params, level):
    returns, mask, group, _ = energy_of(random_batch(*params))
    advantages = get_baseline("otb")(
        returns, mask, group, torch.full_like(returns, level), handle_zero_tail=False
    )
    same_group = (group[:, None] == group[None, :]).double()  # [B, B]
    active = same_group @ mask  # members of i's group generating at t
    mean_active = (same_group @ (returns * mask)) / active.clamp_min(1)
    singleton = same_group.sum(-1) == 1
    expected = torch.where(singleton[:, None], returns, returns - mean_active) * mask
    torch.testing.assert_close(advantages, expected, atol=1e-6, rtol=1e-6)


@settings(max_examples=40, deadline=None)
@given(batches, st.floats(-3.0, 3.0))
def test_mean_with_equal_rewards_gives_zero_advantages(params, value):
    _, mask, group, *_ = random_batch(*params)
    returns = torch.full(mask.shape, value, dtype=F64)
    advantages = get_baseline("mean")(returns, mask, group, None)
    singleton = (group[:, None] == group[None, :]).sum(-1) == 1
    torch.testing.assert_close(advantages[~singleton], torch.zeros_like(advantages[~singleton]))
    torch.testing.assert_close(advantages[singleton], returns[singleton] * mask[singleton])
