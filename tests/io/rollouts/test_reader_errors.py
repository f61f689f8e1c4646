"""Bad rollout files (otb_diag/io/rollouts/readers.py): every error names the file, the line or
row, and the field."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from rollout_files import good_row, read_error, write_jsonl, write_parquet

from otb_diag.io.rollouts.readers import TOKEN_FIELDS

# --- bad input ------------------------------------------------------------------------------

# (bad row, field the error names, words the message contains); the bad row goes on line 2.
BAD_ROWS = [
    (good_row(reward=None, token_rewards=None, rewrd=1.0), "reward", "'reward' or 'token_rewards'"),
    (
        good_row(reward=None, token_rewards=None, rewrd=1.0),
        "reward",
        "(found 'rewrd': misspelled?)",
    ),
    (good_row(group=None), "group", "missing required field 'group' or 'uid'"),
    (good_row(response=None, response_ids=None), "response", "missing required field"),
    (good_row(prompt=None, prompt_ids=None), "prompt", "missing required field"),
    (good_row(reward="1.0"), "reward", "expected a number, got str '1.0'"),
    (good_row(response_ids=[3, 1.5, 2]), "response_ids", "entry 1"),
    (good_row(response_ids=[3, "1", 2]), "response_ids", "entry 1"),
    (good_row(prompt_ids=[1, -2]), "prompt_ids", "non-negative"),
    (good_row(response_ids="3 1 2"), "response_ids", "expected a list"),
    (good_row(mask=[1, 2, 1]), "mask", "mask values are 0 or 1"),
    (good_row(reward=float("nan")), "reward", "finite"),
    (good_row(reward=float("inf")), "reward", "finite"),
    (good_row(token_rewards=[0.0, float("-inf"), 1.0]), "token_rewards", "entry 1"),
    (good_row(logprobs=[0.0, float("nan"), 1.0]), "logprobs", "entry 1"),
    (good_row(prompt=3), "prompt", "expected a string"),
    (good_row(group=[1]), "group", "expected a string or an integer"),
    (good_row(step=1.5), "step", "expected an integer"),
    (good_row(temperature=0), "temperature", "positive"),
    (good_row(prompt_ids=[]), "prompt_ids", "no tokens"),
    (good_row(advantage_estimator="otb"), "advantage_estimator", 'expected {"baseline": NAME'),
    (good_row(advantage_estimator={"options": {}}), "advantage_estimator", "got dict"),
    (
        good_row(advantage_estimator={"baseline": "otb", "options": {"eps": [1]}}),
        "advantage_estimator",
        'expected {"baseline"',
    ),
    (
        good_row(advantage_estimator={"baseline": "otbb"}),
        "advantage_estimator",
        "unknown baseline 'otbb'; known: none, mean",
    ),
] + [
    (good_row(**{name: [1, 1]}), name, "has 2 entries but the response has 3 tokens")
    for name in TOKEN_FIELDS
]


@pytest.mark.parametrize(("bad", "field", "words"), BAD_ROWS)
def test_bad_jsonl_row_names_file_line_and_field(
    tmp_path: Path, bad: dict[str, Any], field: str, words: str
) -> None:
    path = write_jsonl(tmp_path / "r.jsonl", [good_row(), bad])
    message = read_error(path)
    assert message.startswith(f"{path}, line 2, field '{field}': ")
    assert words in message


# Parquet columns hold one type, so only value errors can sit in a row of their own.
PARQUET_BAD_ROWS = [
    (good_row(reward=float("nan")), "reward", "finite"),
    (good_row(mask=[1, 2, 1]), "mask", "0 or 1"),
    (good_row(logprobs=[0.0, 1.0]), "logprobs", "has 2 entries"),
    (good_row(reward=None, token_rewards=None), "reward", "missing required field 'reward'"),
]


@pytest.mark.parametrize(("bad", "field", "words"), PARQUET_BAD_ROWS)
def test_bad_parquet_row_names_file_row_and_field(
    tmp_path: Path, bad: dict[str, Any], field: str, words: str
) -> None:
    path = write_parquet(tmp_path / "r.parquet", [good_row(), bad])
    message = read_error(path)
    assert message.startswith(f"{path}, row 1, field '{field}': ")
    assert words in message


@pytest.mark.parametrize(
    ("line", "words"),
    [('{"group": "g", "reward": }', "malformed JSON"), ("[1, 2]", "expected a JSON object")],
)
def test_unreadable_json_line(tmp_path: Path, line: str, words: str) -> None:
    path = write_jsonl(tmp_path / "r.jsonl", [good_row(), line])
    message = read_error(path)
    assert message.startswith(f"{path}, line 2: ")
    assert words in message


def test_a_cut_line_names_its_column_once(tmp_path: Path) -> None:
    """A line cut inside a string: the parser's "Unterminated string starting at" and the
    column in one phrase ("at at column" before)."""
    path = write_jsonl(tmp_path / "r.jsonl", [good_row(), '{"group": "g", "response": "ab'])
    path.write_text(path.read_text().rstrip("\n"))  # the file ends where it was cut
    message = read_error(path)
    assert "malformed JSON: Unterminated string starting at column 28." in message  # "ab
    assert "at at" not in message


def test_errors_come_in_file_order(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "r.jsonl", [good_row(), good_row(reward="x"), "{bad"])
    assert read_error(path).startswith(f"{path}, line 2, field 'reward'")


def test_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "nope.jsonl"
    assert read_error(path) == f"{path}: file does not exist"


@pytest.mark.parametrize("content", ["", "\n\n  \n"])
def test_empty_jsonl_file(tmp_path: Path, content: str) -> None:
    path = tmp_path / "r.jsonl"
    path.write_text(content)
    assert read_error(path).startswith(f"{path}: the file has no rows")


def test_empty_parquet_file(tmp_path: Path) -> None:
    path = tmp_path / "r.parquet"
    pq.write_table(pa.table({"group": pa.array([], pa.string())}), path)
    assert read_error(path).startswith(f"{path}: the file has no rows")


def test_unreadable_parquet_file(tmp_path: Path) -> None:
    path = tmp_path / "r.parquet"
    path.write_text("not parquet")
    assert read_error(path).startswith(f"{path}: not a readable Parquet file")


def test_unknown_suffix(tmp_path: Path) -> None:
    path = tmp_path / "r.csv"
    path.write_text("group,reward\n")
    assert "unknown rollout file type '.csv'" in read_error(path)
