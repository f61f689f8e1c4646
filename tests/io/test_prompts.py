"""Prompt files: JSONL, Parquet, CSV; text or messages; errors name file, line/row and field."""

import json
from pathlib import Path

import pandas as pd
import pytest

from otb_diag.errors import InputError
from otb_diag.io.prompts import read_prompts


def test_the_three_formats_give_the_same_prompts(tmp_path: Path) -> None:
    rows = [{"q": "What is 2+3?", "a": "5"}, {"q": "Say hi,\nplease", "a": "hi"}]
    (tmp_path / "p.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    pd.DataFrame(rows).to_parquet(tmp_path / "p.parquet")
    pd.DataFrame(rows).to_csv(tmp_path / "p.csv", index=False)
    for name in ("p.jsonl", "p.parquet", "p.csv"):
        got = read_prompts(tmp_path / name, "q", "a")
        assert [(p.prompt, p.answer) for p in got] == [
            ("What is 2+3?", "5"),
            ("Say hi,\nplease", "hi"),
        ]
    csv_rows = read_prompts(tmp_path / "p.csv", "q", "a")
    assert [p.line for p in csv_rows] == [2, 3]  # the header is line 1
    assert [p.row for p in read_prompts(tmp_path / "p.parquet", "q", "a")] == [0, 1]


def test_messages_and_the_default_answer_column(tmp_path: Path) -> None:
    chat = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2?"}]
    path = tmp_path / "p.jsonl"
    path.write_text(
        json.dumps({"prompt": chat, "answer": "4"}) + "\n" + json.dumps({"prompt": "x"}) + "\n"
    )
    first, second = read_prompts(path)
    assert first.prompt == chat and first.answer == "4" and second.answer is None
    assert first.text == "system: Be brief.\nuser: 2+2?"


@pytest.mark.parametrize(
    ("line", "column", "expected"),
    [
        ({"prompt": ""}, None, "line 2, field 'prompt': the prompt is empty"),
        ({"text": "x"}, None, "line 2, field 'prompt': no prompt column"),
        ({"prompt": "x"}, "answer", "line 2, field 'answer': no answer"),
        ({"prompt": [{"role": "user"}]}, None, "line 2, field 'prompt': a prompt must be"),
    ],
)
def test_bad_rows_name_the_line_and_field(tmp_path: Path, line, column, expected) -> None:
    path = tmp_path / "p.jsonl"
    path.write_text(json.dumps({"prompt": "ok", "answer": "1"}) + "\n" + json.dumps(line) + "\n")
    with pytest.raises(InputError) as err:
        read_prompts(path, answer_column=column)
    assert str(err.value).startswith(f"{path}, {expected}")


def test_a_datasets_directory(tmp_path: Path) -> None:
    datasets = pytest.importorskip("datasets")
    datasets.Dataset.from_list([{"prompt": "a", "answer": "1"}]).save_to_disk(str(tmp_path / "d"))
    (only,) = read_prompts(tmp_path / "d")
    assert (only.prompt, only.answer, only.row) == ("a", "1", 0)
