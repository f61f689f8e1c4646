import json
from pathlib import Path

import pytest
import torch

from otb_diag.io.loading import load_rollouts
from otb_diag.io.rollouts.to_batch import make_batch


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
