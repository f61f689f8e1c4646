"""Prompt files for `rollouts sample`: JSONL, Parquet, CSV or a `datasets` directory saved with
`save_to_disk` (when the `datasets` package is installed), one prompt per row, with an optional
answer for the verifier; and their tokenization, exactly as chat trainers tokenize them.

A prompt is text or a list of chat messages (`{"role": ..., "content": ...}`). Every problem is
an `InputError` naming the file, the line (JSONL and CSV, 1-based) or row (Parquet and
`datasets`, 0-based) and the field.
"""

from __future__ import annotations

import csv
import importlib.util
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from otb_diag.errors import InputError
from otb_diag.io.rollouts.records import jsonl_records


@dataclass(frozen=True)
class PromptRow:
    """One prompt: its 0-based `index` among the prompts, where it is (`line` 1-based or `row`
    0-based), the prompt (text or messages) and the answer (text, or None)."""

    index: int
    prompt: str | list[dict[str, str]]
    answer: str | None
    line: int | None = None
    row: int | None = None

    def error(self, path: Path, message: str, field: str, hint: str | None = None) -> InputError:
        return InputError(message, path=path, line=self.line, row=self.row, field=field, hint=hint)

    @property
    def text(self) -> str:
        """The prompt as text (messages as `role: content` lines), for verifiers and the rows."""
        if isinstance(self.prompt, str):
            return self.prompt
        return "\n".join(f"{m['role']}: {m['content']}" for m in self.prompt)


def read_prompts(
    path: str | Path, prompt_column: str = "prompt", answer_column: str | None = None
) -> list[PromptRow]:
    """Every prompt in `path`. `answer_column` None takes the column `answer` when the rows have
    one; a named `answer_column` must be present on every row."""
    path = Path(path)
    if not path.exists():
        raise InputError("prompts file does not exist", path=path)
    rows: list[PromptRow] = []
    for where, record in _records(path):
        if prompt_column not in record:
            keys = ", ".join(sorted(record)) or "none"
            raise InputError(
                f"no prompt column '{prompt_column}' (the row has: {keys})",
                path=path,
                field=prompt_column,
                hint="Name the column with --prompt-column.",
                **where,
            )
        prompt = _prompt(record[prompt_column], path, prompt_column, where)
        column = answer_column or "answer"
        if answer_column is not None and record.get(column) is None:
            raise InputError(
                f"no answer in column '{column}'",
                path=path,
                field=column,
                hint="Every prompt needs its answer for the verifier; name the column with "
                "--answer-column.",
                **where,
            )
        answer = record.get(column)
        rows.append(PromptRow(len(rows), prompt, None if answer is None else str(answer), **where))
    if not rows:
        raise InputError("holds no prompts", path=path)
    return rows


def _prompt(value: Any, path: Path, field: str, where: dict[str, int]) -> str | list[dict]:
    if isinstance(value, str):
        if not value.strip():
            raise InputError("the prompt is empty", path=path, field=field, **where)
        return value
    if isinstance(value, list) and value and all(_is_message(m) for m in value):
        if not any(str(m["content"]).strip() for m in value):
            raise InputError(
                "every message of the prompt is empty", path=path, field=field, **where
            )
        return [{"role": str(m["role"]), "content": str(m["content"])} for m in value]
    raise InputError(
        f"a prompt must be text or a non-empty list of {{role, content}} messages, got "
        f"{type(value).__name__}",
        path=path,
        field=field,
        **where,
    )


def _is_message(m: Any) -> bool:
    return isinstance(m, dict) and isinstance(m.get("role"), str) and "content" in m


def _records(path: Path) -> Iterator[tuple[dict[str, int], dict[str, Any]]]:
    if path.is_dir():
        yield from _dataset_records(path)
        return
    suffix = path.suffix.lower()
    if suffix in (".jsonl", ".json"):
        for _, line, record in jsonl_records(path, None):
            yield {"line": line}, record
    elif suffix == ".parquet":
        import pyarrow.parquet as pq

        for i, record in enumerate(pq.read_table(path).to_pylist()):
            yield {"row": i}, record
    elif suffix == ".csv":
        with path.open(newline="", encoding="utf-8") as handle:
            reader = csv.DictReader(handle)
            start = 2  # line 1 is the header
            for record in reader:
                yield {"line": start}, {k: v for k, v in record.items() if v != ""}
                start = reader.line_num + 1
    else:
        raise InputError(
            f"unknown prompts format '{suffix}'",
            path=path,
            hint="Use .jsonl, .parquet, .csv or a directory saved by datasets' save_to_disk.",
        )


def _dataset_records(path: Path) -> Iterator[tuple[dict[str, int], dict[str, Any]]]:
    if not ((path / "dataset_info.json").is_file() or (path / "dataset_dict.json").is_file()):
        raise InputError(
            "is a directory but not a `datasets` save_to_disk directory (no dataset_info.json)",
            path=path,
        )
    if importlib.util.find_spec("datasets") is None:
        raise InputError(
            "is a `datasets` directory, and reading it needs the datasets package, which is not "
            "installed.",
            path=path,
            hint="`pip install datasets`, or export the prompts to JSONL/Parquet/CSV.",
        )
    from datasets import DatasetDict, load_from_disk

    data = load_from_disk(str(path))
    if isinstance(data, DatasetDict):
        splits = list(data)
        if "train" not in splits and len(splits) != 1:
            raise InputError(
                f"holds several splits ({', '.join(splits)}) and none is 'train'",
                path=path,
                hint="Save the split you want on its own.",
            )
        data = data["train" if "train" in splits else splits[0]]
    for i, record in enumerate(data):
        yield {"row": i}, dict(record)


def tokenize_prompt(tokenizer: Any, row: PromptRow, chat_template: bool, path: Path) -> list[int]:
    """The exact prompt ids: through the chat template with the generation prompt (one user turn
    for a text prompt) when `chat_template` and the tokenizer has one, as chat trainers do;
    else the text with the tokenizer's special tokens."""
    if chat_template and getattr(tokenizer, "chat_template", None):
        one_turn = [{"role": "user", "content": row.prompt}]
        messages = row.prompt if isinstance(row.prompt, list) else one_turn
        text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        return [int(i) for i in tokenizer(text, add_special_tokens=False)["input_ids"]]
    if isinstance(row.prompt, list):
        why = "--no-chat-template was given" if not chat_template else "the tokenizer has none"
        raise row.error(
            path,
            f"the prompt is a list of chat messages, which needs a chat template, but {why}",
            "prompt",
            "Give text prompts, or a checkpoint whose tokenizer has a chat template.",
        )
    return [int(i) for i in tokenizer(row.prompt)["input_ids"]]
