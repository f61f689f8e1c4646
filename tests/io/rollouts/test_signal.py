"""Which groups' rewards carry a signal (`otb_diag/io/loading.py:groups_with_signal`), read off
the rows before any model: hand cases, and for any pool the tensors' own account, that the
mean baseline's advantages of a group are all zero exactly where it says "no signal"."""

from __future__ import annotations

from pathlib import Path

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from otb_diag.io.loading import group_rows, groups_with_signal
from otb_diag.io.rollouts.readers import Rollouts
from otb_diag.io.rollouts.rows import Response
from otb_diag.io.rollouts.to_batch import make_batch
from otb_diag.maths.estimators.advantages import token_advantages
from otb_diag.maths.returns import returns_to_go


def response(group: str, sample: int, **fields) -> Response:
    n = len(fields.get("response_ids", [1, 2]))
    fields.setdefault("response_ids", list(range(1, n + 1)))
    return Response(group=group, sample=sample, source_row=sample, prompt_ids=[1], **fields)


def signal(responses: list[Response]) -> list[bool]:
    return groups_with_signal(responses, group_rows(responses))


def test_outcome_rewards() -> None:
    assert signal([response("a", 0, reward=0.0), response("a", 1, reward=0.0)]) == [False]
    assert signal([response("a", 0, reward=1.0), response("a", 1, reward=1.0)]) == [False]
    assert signal([response("a", 0, reward=1.0), response("a", 1, reward=0.0)]) == [True]
    # an empty response gets no reward (none is placed): beside a rewarded one, a signal
    empty = response("a", 1, reward=1.0, response_ids=[])
    assert signal([response("a", 0, reward=1.0), empty]) == [True]
    # tool output only (mask 0 everywhere): nothing generated, so no reward either
    tool = response("a", 1, reward=1.0, mask=[0, 0])
    assert signal([response("a", 0, reward=0.0), tool]) == [False]


def test_token_rewards_that_vary_along_a_response_carry_a_signal() -> None:
    """Equal totals, but a reward on the first token: G_t differs along the response."""
    early = response("a", 0, token_rewards=[1.0, 0.0])
    late = response("a", 1, token_rewards=[0.0, 1.0])
    assert signal([late, response("a", 2, token_rewards=[0.0, 1.0])]) == [False]
    assert signal([early, late]) == [True]
    # a reward on a tool token (mask 0) is dropped, as returns_to_go drops it
    masked = response("a", 2, token_rewards=[5.0, 1.0], mask=[0, 1])
    assert signal([late, masked]) == [False]


rewards = st.sampled_from([0.0, 1.0, 2.0])


@st.composite
def rows(draw) -> dict:
    n = draw(st.integers(0, 4))
    mask = draw(st.none() | st.lists(st.sampled_from([0, 1]), min_size=n, max_size=n))
    token = draw(st.booleans())
    return dict(
        response_ids=list(range(1, n + 1)),
        mask=mask,
        reward=None if token else draw(rewards),
        token_rewards=draw(st.lists(rewards, min_size=n, max_size=n)) if token else None,
    )


@settings(max_examples=150, deadline=None)
@given(st.lists(st.lists(rows(), min_size=2, max_size=4), min_size=1, max_size=4))
def test_no_signal_exactly_where_the_mean_baselines_advantages_are_zero(groups) -> None:
    responses = [
        response(f"g{g}", i, **row) for g, members in enumerate(groups)
        for i, row in enumerate(members)
    ]  # fmt: skip
    batch = make_batch(Rollouts(Path("pool.jsonl"), "jsonl", responses))
    returns = returns_to_go(batch.token_rewards, batch.mask)
    advantages = token_advantages("mean", returns, batch.mask, batch.group, None)
    moved = torch.zeros(len(groups), dtype=torch.bool).index_put_(
        (batch.group,), (advantages != 0).any(-1), accumulate=True
    )
    assert signal(responses) == moved.tolist()
