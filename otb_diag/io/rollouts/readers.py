"""Reading and validating rollout files: one row per sampled response, grouped by prompt.

A rollout file is JSON Lines (`.jsonl`, `.json`) or Parquet (`.parquet`; `records.py`). Each row
carries a group id, the prompt and response as text and/or token ids, and an outcome `reward`
and/or per-token `token_rewards`; optional per-token fields (`mask`, `logprobs`, `sum_pi2`,
`is_weights`) and `step`, `temperature`, `trainer_advantage`. Extra keys are ignored. A trainer's
dump (verl's rollout dumps, TRL's completion logs) is recognised from its keys and mapped by its
module under `otb_diag/io/trainers/`. Logged probabilities are checked for physical consistency
(`probability_checks.py`). Sets of files (a directory, a glob) are read by the index pass of
`stream.py`, which every command goes through.

Everything that can be checked without a tokenizer is checked by `iter_responses`; every problem
is an `InputError` naming the file, the line (JSONL, 1-based) or row (Parquet, 0-based) and the
field.
`tokenize_rollouts` fills in missing token ids with the checkpoint's tokenizer and `check_vocab`
checks them against the checkpoint's vocabulary.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterator
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from otb_diag.errors import InputError
from otb_diag.io.rollouts.probability_checks import CLAMPED_FIELDS, check_probabilities
from otb_diag.io.rollouts.records import READERS, open_records
from otb_diag.io.rollouts.rows import KEYS, RawRow, Response
from otb_diag.io.trainers import dump_trainer

if TYPE_CHECKING:
    import pandas as pd

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

    def groups(self) -> dict[str, list[int]]:
        """Group id -> indices into `responses`, groups in order of first appearance."""
        out: dict[str, list[int]] = {}
        for i, r in enumerate(self.responses):
            out.setdefault(r.group, []).append(i)
        return out

    def to_frame(self) -> pd.DataFrame:
        """One row per response, one column per `Response` field."""
        import pandas as pd

        return pd.DataFrame([asdict(r) for r in self.responses])

    @property
    def row_word(self) -> str:
        """How rows are counted: "line" (JSONL, 1-based) or "row" (Parquet, 0-based)."""
        return "row" if self.format.endswith("parquet") else "line"

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


@dataclass(frozen=True)
class RoundTripIssue:
    """A text whose token ids, made by the tokenizer, do not decode back to the same text.

    Reported, not fatal: the ids are still used, but they are not the tokens the policy sampled.
    """

    group: str
    sample: int
    location: str  # "line 3" or "row 3"
    field: str  # "prompt" or "response"
    text: str
    decoded: str

    def __str__(self) -> str:
        return (
            f"{self.location}, field '{self.field}': the tokenizer does not reproduce the text "
            f"(text {self.text!r}, decoded {self.decoded!r})"
        )


class TextTokenizer(Protocol):
    """The two methods of a Hugging Face tokenizer that rollouts need."""

    def encode(self, text: str, add_special_tokens: bool = ...) -> list[int]: ...

    def decode(self, token_ids: list[int], skip_special_tokens: bool = ...) -> str: ...


def iter_responses(
    path: str | Path,
    keep: Callable[[int], bool] | None = None,
    *,
    reward_columns: list[str] | None = None,
) -> tuple[Rollouts, Iterator[tuple[int, Response]]]:
    """The file's (still empty) `Rollouts` and an iterator over `(index, Response)`, validated
    one row at a time, in file order (errors too: a bad line 2 before a malformed line 3).

    Rows that `keep(index)` rejects are not decoded. Sample numbers are not set (they need the
    rows before); rows of trainer dumps (`otb_diag/io/trainers/`) without a group id are grouped
    by (step, prompt) as they come. `reward_columns` names the reward columns of a TRL
    completion log (default: every numeric reward-function column). Logged probabilities are
    checked as rows come, and the values clamped onto a consistency rule are counted in
    `rollouts.clamped`.
    """
    path = Path(path)
    kind, keys, records = open_records(path, keep)
    trainer = dump_trainer(keys)
    rollouts = Rollouts(path, f"{trainer.name}-{kind}" if trainer else kind, [])
    row_keys = trainer.dump_keys if trainer else KEYS
    prepare = trainer.prepare if trainer else None

    def rows() -> Iterator[tuple[int, Response]]:
        step_groups: dict[tuple[int, str], str] = {}  # trainer dumps group by (step, prompt)
        for index, source_row, record in records:

            def fail(name: str, message: str, hint: str | None, at: int = source_row) -> InputError:
                return rollouts.error(at, message, field=name, hint=hint)

            if prepare is not None:
                record = prepare(record, reward_columns, fail)
            row = RawRow(rollouts.error, source_row, record, row_keys)
            response = row.parse(step_groups if trainer else None, str(path))
            _check_token_fields(rollouts, response, row.key)
            response, counts = check_probabilities(response, row.fail)
            for name, count in counts.items():
                rollouts.clamped[name] += count
            yield index, response

    return rollouts, rows()


def tokenize_rollouts(
    rollouts: Rollouts, tokenizer: TextTokenizer, *, chat_template: bool = False
) -> tuple[Rollouts, list[RoundTripIssue]]:
    """Fill in missing token ids from the text and return the texts that do not round-trip.

    Prompts are encoded with the tokenizer's special tokens (BOS and the like), responses
    without. The round trip compares `decode(encode(text, add_special_tokens=False),
    skip_special_tokens=False)` with the text: special tokens written in the text itself (a chat
    template, an end marker) must survive, and the ones the tokenizer adds are not in the text.
    Ids given in the file are authoritative and not checked against the text.

    With `chat_template`, a text prompt becomes one user turn (or the row's own
    `prompt_messages`) rendered by the tokenizer's chat template with the generation prompt.
    """
    if chat_template and not getattr(tokenizer, "chat_template", None):
        raise InputError(
            "--chat-template given, but the checkpoint's tokenizer has no chat template",
            field="--chat-template",
        )
    issues: list[RoundTripIssue] = []
    responses = []
    for r in rollouts.responses:
        filled = {}
        for text_field, ids_field, specials in (
            ("prompt", "prompt_ids", True),
            ("response", "response_ids", False),
        ):
            text = getattr(r, text_field)
            if getattr(r, ids_field) is not None or text is None:
                continue
            if chat_template and text_field == "prompt":
                filled[ids_field] = _templated(tokenizer, r)
                continue
            filled[ids_field] = tokenizer.encode(text, add_special_tokens=specials)
            plain = tokenizer.encode(text, add_special_tokens=False)
            decoded = tokenizer.decode(plain, skip_special_tokens=False)
            if decoded != text:
                where = f"{rollouts.row_word} {r.source_row}"
                issues.append(RoundTripIssue(r.group, r.sample, where, text_field, text, decoded))
        response = replace(r, **filled)
        _check_token_fields(rollouts, response, lambda name: name, from_tokenizer=filled)
        responses.append(response)
    return replace(rollouts, responses=responses), issues


def prompts_without_template(rollouts: Rollouts, tokenizer: TextTokenizer) -> int:
    """How many text prompts would be tokenized without the chat template the tokenizer has
    (0 when it has none). Trainers dump text decoded with `skip_special_tokens`, which drops a
    chat prompt's special tokens: such prompts want `--chat-template` or exact ids."""
    if not getattr(tokenizer, "chat_template", None):
        return 0
    return sum(1 for r in rollouts.responses if r.prompt_ids is None and r.prompt is not None)


def _templated(tokenizer: Any, r: Response) -> list[int]:
    """The prompt as the trainer's model saw it: its messages (or one user turn) rendered by
    the chat template, with the generation prompt."""
    messages = r.prompt_messages or [{"role": "user", "content": r.prompt}]
    out = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    ids = out["input_ids"] if hasattr(out, "keys") else out
    return [int(i) for i in ids]


def check_vocab(rollouts: Rollouts, vocab_size: int) -> None:
    """Raise `InputError` for the first token id outside `0 .. vocab_size - 1`.

    Rows without ids have nothing to check: call this after `tokenize_rollouts`. When the row
    logs `logprobs` and `sum_pi2`, the hint offers `--model-free` (no checkpoint needed).
    """
    for r in rollouts.responses:
        for name in ("prompt_ids", "response_ids"):
            ids = getattr(r, name) or []
            if not ids or max(ids) < vocab_size:  # one C-level pass for the common case
                continue
            bad = next((i for i, tok in enumerate(ids) if tok >= vocab_size), None)
            if bad is not None:
                hint = "Were these rollouts made with another model's tokenizer? Give its "
                hint += "checkpoint with --ckpt"
                if r.logprobs is not None and r.sum_pi2 is not None:
                    hint += (
                        ", or, since the rows log logprobs and sum_pi2, measure them without a "
                        "model with --model-free"
                    )
                raise rollouts.error_at(
                    r,
                    f"token id {ids[bad]} at position {bad} is outside the checkpoint's "
                    f"vocabulary of size {vocab_size} (valid ids are 0 to {vocab_size - 1}).",
                    field=name,
                    hint=hint + ".",
                )


def _check_token_fields(
    rollouts: Rollouts,
    r: Response,
    key: Callable[[str], str],
    *,
    from_tokenizer: Collection[str] = (),
) -> None:
    """Once token ids are known: no empty id list, one per-token entry per response token.

    `key` maps a canonical field name to the name to report; `from_tokenizer` names the id
    fields that the tokenizer made rather than the file, which the message should say.
    """

    def origin(ids_field: str) -> str:
        return (
            " (as tokenized by the checkpoint's tokenizer)" if ids_field in from_tokenizer else ""
        )

    for name, what in (("prompt_ids", "prompt"), ("response_ids", "response")):
        if getattr(r, name) == []:
            raise rollouts.error_at(
                r,
                f"the {what} has no tokens{origin(name)}: the first response token is predicted "
                "from the last prompt token, so both must be non-empty.",
                field=key(name),
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
