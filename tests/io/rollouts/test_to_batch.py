import json
from dataclasses import fields
from pathlib import Path

import pytest
import torch

from otb_diag.integrations.core.dump import batch_rows
from otb_diag.integrations.core.step_metrics import round_off_clamped
from otb_diag.io.atomic import write_jsonl
from otb_diag.io.loading import load_rollouts
from otb_diag.io.rollouts.to_batch import make_batch
from otb_diag.maths.response_batch import ResponseBatch


def write(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_batch_tensors_hand_case(tmp_path: Path) -> None:
    rows = [
        {"group": "b", "prompt_ids": [5, 6], "response_ids": [1, 2, 3], "reward": 1.0},
        {"group": "a", "prompt_ids": [5], "response_ids": [4], "reward": 0.5, "temperature": 0.7},
        # tool output at t = 1, 2: the outcome reward sits on the last *generated* token (t = 3)
        {
            "group": "b",
            "prompt_ids": [7],
            "response_ids": [1, 9, 9, 2, 3],
            "reward": 2.0,
            "mask": [1, 0, 0, 1, 0],
        },
    ]
    batch = make_batch(load_rollouts(write(tmp_path / "r.jsonl", rows)))
    assert batch.group_names == ["b", "a"]
    assert batch.group.tolist() == [0, 1, 0]
    assert batch.sample.tolist() == [0, 0, 1]
    assert batch.length.tolist() == [3, 1, 5]
    assert batch.response_ids.tolist() == [[1, 2, 3, 0, 0], [4, 0, 0, 0, 0], [1, 9, 9, 2, 3]]
    assert batch.mask.tolist() == [[1, 1, 1, 0, 0], [1, 0, 0, 0, 0], [1, 0, 0, 1, 0]]
    assert batch.valid.sum(-1).tolist() == [3, 1, 5]
    assert batch.token_rewards.tolist() == [
        [0, 0, 1, 0, 0],
        [0.5, 0, 0, 0, 0],
        [0, 0, 0, 2, 0],
    ]
    assert batch.reward.tolist() == [1.0, 0.5, 2.0]
    assert batch.temperature.tolist() == pytest.approx([1.0, 0.7, 1.0])
    assert batch.prompt_ids == [[5, 6], [5], [7]]
    assert batch.logprobs is None and batch.is_weights is None


def test_token_rewards_win_and_optional_fields_pad(tmp_path: Path) -> None:
    rows = [
        {
            "group": 0,
            "prompt_ids": [1],
            "response_ids": [2, 3],
            "token_rewards": [0.25, 0.5],
            "logprobs": [-1.0, -1.2],
            "sum_pi2": [0.5, 0.6],
            "is_weights": [0.9, 1.1],
        },
        {
            "group": 0,
            "prompt_ids": [1],
            "response_ids": [2],
            "reward": 3.0,
            "logprobs": [-0.9],
            "sum_pi2": [0.7],
            "is_weights": [0.8],
        },
    ]
    batch = make_batch(load_rollouts(write(tmp_path / "r.jsonl", rows)))
    assert batch.token_rewards.tolist() == [[0.25, 0.5], [3.0, 0.0]]
    assert batch.reward.tolist() == [0.75, 3.0]
    assert torch.allclose(batch.logprobs, torch.tensor([[-1.0, -1.2], [-0.9, 0.0]]))
    # padding of importance weights is 1 (a no-op weight), never 0
    assert torch.allclose(batch.is_weights, torch.tensor([[0.9, 1.1], [0.8, 1.0]]))


def test_untokenized_rows_are_refused(tmp_path: Path) -> None:
    rows = [{"group": 0, "prompt": "a", "response": "b", "reward": 1.0}]
    with pytest.raises(ValueError, match="tokenize_rollouts"):
        make_batch(load_rollouts(write(tmp_path / "r.jsonl", rows)))


def trainer_tensors(seed: int = 0) -> dict:
    """A step as a trainer hands it over: right-padded `[B, C]` tensors (C beyond the longest
    response), anything beyond each response, tool output inside some, one reward and one
    advantage per response, log p with bf16 round-off above 0 and Σπ² an ulp below p²."""
    g = torch.Generator().manual_seed(seed)
    b, c = 8, 9
    length = torch.randint(1, c - 1, (b,), generator=g)
    logprobs = -torch.rand(b, c, generator=g) * 2
    logprobs[0, 0] = 2.0**-9  # round-off: clamped to 0
    sum_pi2 = torch.exp(2 * logprobs) + 0.05 * torch.rand(b, c, generator=g)
    sum_pi2[1, 0] = torch.exp(2 * logprobs[1, 0]) * (1 - 2.0**-20)  # below p²: clamped to it
    return {
        "group_names": ["p0", "p1"],
        "group": torch.arange(b) // 4,
        "prompt_ids": [[1, 2 + i % 3] for i in range(b)],
        "response_ids": torch.randint(3, 50, (b, c), generator=g),
        "length": length,
        "tool_mask": (torch.rand(b, c, generator=g) > 0.2).float(),
        "reward": torch.randn(b, generator=g),
        "trainer_advantage": torch.randn(b, generator=g),
        "temperature": 0.9,
        "step": 4,
        "is_weights": 0.5 + torch.rand(b, c, generator=g),
        **round_off_clamped(logprobs, sum_pi2),
    }


def test_a_trainer_step_reads_back_as_the_same_batch(tmp_path: Path) -> None:
    """The one constructor: the batch the integrations build of a trainer's padded tensors and
    the reader's batch of the same rows dumped (`dump.py`) are equal tensor by tensor: the same
    dtypes, shapes and float32 values (a padding zero may differ in sign: `x · 0` of a trainer's
    negative padding is −0)."""
    live = ResponseBatch.from_padded(**trainer_tensors())
    path = tmp_path / "step.jsonl"
    write_jsonl(path, batch_rows(live))
    back = make_batch(load_rollouts(path))
    assert back.group_names == live.group_names and back.prompt_ids == live.prompt_ids
    assert back.step == live.step == [4] * 8
    for field in fields(ResponseBatch):
        a, b = getattr(back, field.name), getattr(live, field.name)
        if isinstance(a, torch.Tensor):
            assert a.dtype == b.dtype and a.shape == b.shape, field.name
            assert torch.equal(a, b), field.name


def test_all_empty_responses_keep_one_column(tmp_path: Path) -> None:
    """Every response empty (all generations aborted): one padding column, from either route."""
    rows = [{"group": "a", "prompt_ids": [1], "response_ids": [], "reward": 1.0}] * 2
    batch = make_batch(load_rollouts(write(tmp_path / "r.jsonl", rows)))
    assert batch.mask.shape == batch.token_rewards.shape == (2, 1)
    assert batch.reward.tolist() == [0.0, 0.0] and not batch.valid.any()
