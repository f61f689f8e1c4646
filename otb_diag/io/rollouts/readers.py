"""Reading and validating rollout files: one row per sampled response, grouped by prompt.

A rollout file is JSON Lines (`.jsonl`, `.json`) or Parquet (`.parquet`; `records.py`). Each row
carries a group id, the prompt and response as text and/or token ids, and an outcome `reward`
and/or per-token `token_rewards`; optional per-token fields (`mask`, `logprobs`, `sum_pi2`,
`is_weights`) and `step`, `temperature`, `trainer_advantage`. Extra keys are ignored. A trainer's
dump (verl's rollout dumps, TRL's completion logs) is recognised from its keys and mapped by its
module under `otb_diag/io/trainers/`. Logged probabilities are checked for physical consistency
(`probability_checks.py`). Sets of files (a directory, a glob) are read by the index pass of
`stream.py`, which every command goes through.

Everything that can be checked without a tokenizer is checked by `open_rollouts`; every problem
is an `InputError` naming the file, the line (JSONL, 1-based) or row (Parquet, 0-based) and the
field.
Missing token ids are filled in with a checkpoint's tokenizer, and every id is checked against
its vocabulary, by `tokenize.py`, once the checkpoint is loaded (its ids pass the same
`check_token_fields`).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from otb_diag.errors import InputError
from otb_diag.io.rollouts.probability_checks import CLAMPED_FIELDS, check_probabilities
from otb_diag.io.rollouts.records import READERS, Keep, open_records
from otb_diag.io.rollouts.rows import KEYS, RawRow, Response
from otb_diag.io.trainers import dump_trainer

# Per-token fields: one entry per response token.
TOKEN_FIELDS = ("mask", "logprobs", "sum_pi2", "is_weights", "token_rewards")


@dataclass
class Rollouts:
    """The responses of one rollout file (or of several, in step order), in file order.

    `format` is "jsonl", "parquet", "verl-jsonl", "verl-parquet", "trl-parquet" (or "mixed");
    `clamped` counts the logged values clamped onto a consistency rule (`probability_checks.py`);
    `files` lists every file read when there are several (`path` is then what named them).
    """

    path: Path
    format: str
    responses: list[Response]
    clamped: dict[str, int] = field(default_factory=lambda: dict.fromkeys(CLAMPED_FIELDS, 0))
    files: list[Path] = field(default_factory=list)
    # How rows are counted: "line" (JSONL, 1-based) or "row" (Parquet, 0-based); fixed with the
    # format, so the messages of later steps (tokenizing) need nothing more from this module.
    row_word: str = field(init=False)

    def __post_init__(self) -> None:
        self.row_word = "row" if self.format.endswith("parquet") else "line"

    def error(
        self, source_row: int, message: str, *, field: str | None = None, hint: str | None = None
    ) -> InputError:
        """An `InputError` for one row of this file."""
        return InputError(
            message, path=self.path, field=field, hint=hint, **{self.row_word: source_row}
        )

    def error_at(
        self, r: Response, message: str, *, field: str | None = None, hint: str | None = None
    ) -> InputError:
        """An `InputError` for the row of response `r`, in whichever file it came from."""
        path = Path(r.source_path) if r.source_path else self.path
        reader = READERS.get(path.suffix.lower())
        word = "row" if reader is not None and reader.kind == "parquet" else "line"
        return InputError(message, path=path, field=field, hint=hint, **{word: r.source_row})


class RolloutFile(NamedTuple):
    """One rollout file opened once (`open_rollouts`): its (still empty) `Rollouts`, its rows
    (lazy, validated as they come) and, when it is a plain Parquet file (no trainer's dump), the
    open file, from which the index pass may read a few columns instead of the rows (`scan.py`).
    """

    rollouts: Rollouts
    rows: Iterator[tuple[int, Response]]
    plain_parquet: Any  # pyarrow.parquet.ParquetFile, or None


def open_rollouts(
    path: str | Path, keep: Keep = None, *, reward_columns: list[str] | None = None
) -> RolloutFile:
    """The file opened once: its `Rollouts` and an iterator over `(index, Response)`, validated
    one row at a time, in file order (errors too: a bad line 2 before a malformed line 3).

    Rows that `keep` rejects are not decoded (`records.Keep`). Sample numbers are not set (they
    need the rows before); rows of trainer dumps (`otb_diag/io/trainers/`) without a group id
    are grouped by (step, prompt) as they come. `reward_columns` names the reward columns of a
    TRL completion log (default: every numeric reward-function column). Logged probabilities
    are checked as rows come, and the values clamped onto a consistency rule are counted in
    `rollouts.clamped`.
    """
    path = Path(path)
    kind, keys, records, parquet = open_records(path, keep)
    trainer = dump_trainer(keys)
    rollouts = Rollouts(path, f"{trainer.name}-{kind}" if trainer else kind, [])
    row_keys = trainer.dump_keys if trainer else KEYS
    prepare = trainer.prepare if trainer else None
    if trainer is not None and trainer.prepare_file is not None:
        prepare = trainer.prepare_file()  # this file's own (it remembers the rows before)

    def rows() -> Iterator[tuple[int, Response]]:
        step_groups: dict[tuple[int, str], str] = {}  # trainer dumps group by (step, prompt)
        for index, source_row, record in records:

            def fail(name: str, message: str, hint: str | None, at: int = source_row) -> InputError:
                return rollouts.error(at, message, field=name, hint=hint)

            if prepare is not None:
                record = prepare(record, reward_columns, fail)
            row = RawRow(rollouts.error, source_row, record, row_keys)
            response = row.parse(step_groups if trainer else None, str(path))
            check_token_fields(rollouts, response, row.key)
            response, counts = check_probabilities(response, row.fail)
            for name, count in counts.items():
                rollouts.clamped[name] += count
            yield index, response

    return RolloutFile(rollouts, rows(), None if trainer else parquet)


def check_token_fields(
    rollouts: Rollouts,
    r: Response,
    key: Callable[[str], str],
    *,
    from_tokenizer: Collection[str] = (),
) -> None:
    """Once token ids are known: a non-empty prompt, one per-token entry per response token
    (every row as it is read; `tokenize.py` again on the ids the tokenizer made).

    `key` maps a canonical field name to the name to report; `from_tokenizer` names the id
    fields that the tokenizer made rather than the file, which the message should say.
    """

    def origin(ids_field: str) -> str:
        return (
            " (as tokenized by the checkpoint's tokenizer)" if ids_field in from_tokenizer else ""
        )

    # An empty response (an aborted generation; verl keeps its row with an all-zero mask) is
    # kept: its group keeps its size for the baselines, and `energy` counts it. An empty prompt
    # leaves nothing to predict the first response token from.
    if r.prompt_ids == []:
        raise rollouts.error_at(
            r,
            f"the prompt has no tokens{origin('prompt_ids')}: the first response token is "
            "predicted from the last prompt token, so it must be non-empty.",
            field=key("prompt_ids"),
        )
    if r.response_ids is None:
        return
    for name in (*TOKEN_FIELDS, "trainer_advantage"):
        values = getattr(r, name)
        if not isinstance(values, list):
            continue
        if len(values) != len(r.response_ids):
            raise rollouts.error_at(
                r,
                f"has {len(values)} entries but the response has {len(r.response_ids)} "
                f"tokens{origin('response_ids')}: per-token fields need one entry per "
                "response token.",
                field=key(name),
            )
