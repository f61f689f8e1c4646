"""Reading and validating rollout files: one row per sampled response, grouped by prompt.

A rollout file is JSON Lines (`.jsonl`, `.json`) or Parquet (`.parquet`). Each row carries a
group id, the prompt and response as text and/or token ids, and an outcome `reward` and/or
per-token `token_rewards`; optional per-token fields (`mask`, `logprobs`, `sum_pi2`,
`is_weights`) and `step`, `temperature`. Extra keys are ignored. verl rollout dumps (`input`,
`output`, `score`, `step`) are recognised from their keys.

Everything that can be checked without a tokenizer is checked by `read_rollouts`; every problem is
an `InputError` naming the file, the line (JSONL, 1-based) or row (Parquet, 0-based) and the field.
`tokenize_rollouts` fills in missing token ids with the checkpoint's tokenizer and `check_vocab`
checks them against the checkpoint's vocabulary.
"""

from __future__ import annotations

import difflib
import itertools
import json
import math
from collections.abc import Callable, Collection, Iterator
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Protocol

import pandas as pd

from otb_diag.errors import InputError

# Canonical field name -> keys accepted for it, in order of preference.
_KEYS: dict[str, tuple[str, ...]] = {
    "group": ("group", "uid"),
    "prompt": ("prompt",),
    "response": ("response",),
    "prompt_ids": ("prompt_ids",),
    "response_ids": ("response_ids",),
    "reward": ("reward",),
    "token_rewards": ("token_rewards",),
    "mask": ("mask",),
    "step": ("step",),
    "logprobs": ("logprobs", "old_log_probs"),
    "sum_pi2": ("sum_pi2", "sum_pi_squared"),
    "is_weights": ("is_weights",),
    "temperature": ("temperature",),
}
# verl dumps name the text and the score differently and group by `uid` when they have one.
_VERL_KEYS = {
    **_KEYS,
    "group": ("uid",),
    "prompt": ("input",),
    "response": ("output",),
    "reward": ("score",),
}
_VERL_SIGNATURE = ("input", "output", "score")

# Each entry is one requirement, satisfied by any of its fields.
_REQUIRED = (("group",), ("prompt", "prompt_ids"), ("response", "response_ids"))
_REQUIRED_REWARD = ("reward", "token_rewards")

# Per-token fields: one entry per response token.
TOKEN_FIELDS = ("mask", "logprobs", "sum_pi2", "is_weights", "token_rewards")

_SUFFIXES = {".jsonl": "jsonl", ".json": "jsonl", ".parquet": "parquet"}


@dataclass(frozen=True)
class Response:
    """One sampled response with everything the file said about it (canonical field names).

    `sample` is the 0-based position within its group in file order; `source_row` is where the
    row came from (JSONL line, 1-based; Parquet row, 0-based), kept for error messages.
    """

    group: str
    sample: int
    source_row: int
    prompt: str | None = None
    response: str | None = None
    prompt_ids: list[int] | None = None
    response_ids: list[int] | None = None
    reward: float | None = None
    token_rewards: list[float] | None = None
    mask: list[int] | None = None
    step: int | None = None
    logprobs: list[float] | None = None
    sum_pi2: list[float] | None = None
    is_weights: list[float] | None = None
    temperature: float = 1.0


@dataclass
class Rollouts:
    """The responses of one rollout file, in file order.

    `format` is "jsonl", "parquet", "verl-jsonl" or "verl-parquet".
    """

    path: Path
    format: str
    responses: list[Response]

    def groups(self) -> dict[str, list[int]]:
        """Group id -> indices into `responses`, groups in order of first appearance."""
        out: dict[str, list[int]] = {}
        for i, r in enumerate(self.responses):
            out.setdefault(r.group, []).append(i)
        return out

    def to_frame(self) -> pd.DataFrame:
        """One row per response, one column per `Response` field."""
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


def read_rollouts(path: str | Path) -> Rollouts:
    """Read and validate a rollout file; raise `InputError` on the first bad row."""
    path = Path(path)
    kind = _SUFFIXES.get(path.suffix.lower())
    if kind is None:
        raise InputError(
            f"unknown rollout file type '{path.suffix}'",
            path=path,
            hint="Use .jsonl (or .json, read as JSON Lines) or .parquet.",
        )
    if not path.exists():
        raise InputError("file does not exist", path=path)
    if not path.is_file():
        raise InputError("not a file", path=path)
    # Read lazily, so that errors come in file order (a bad line 2 before a malformed line 3).
    records = _read_jsonl(path) if kind == "jsonl" else _read_parquet(path)
    first = next(records, None)
    if first is None:
        raise InputError("the file has no rows", path=path, hint="Expected one row per response.")

    verl = all(key in first[1] for key in _VERL_SIGNATURE)
    rollouts = Rollouts(path, f"verl-{kind}" if verl else kind, [])
    verl_groups: dict[tuple[int, str], str] = {}
    for source_row, record in itertools.chain([first], records):
        row = _Row(rollouts, source_row, record, _VERL_KEYS if verl else _KEYS)
        response = row.parse(verl_groups if verl else None)
        _check_token_fields(rollouts, response, row.key)
        rollouts.responses.append(response)
    rollouts.responses = _number_samples(rollouts.responses)
    return rollouts


def tokenize_rollouts(
    rollouts: Rollouts, tokenizer: TextTokenizer
) -> tuple[Rollouts, list[RoundTripIssue]]:
    """Fill in missing token ids from the text and return the texts that do not round-trip.

    Prompts are encoded with the tokenizer's special tokens (BOS and the like), responses
    without. The round trip compares `decode(encode(text, add_special_tokens=False),
    skip_special_tokens=False)` with the text: special tokens written in the text itself (a chat
    template, an end marker) must survive, and the ones the tokenizer adds are not in the text.
    Ids given in the file are authoritative and not checked against the text.
    """
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
            filled[ids_field] = tokenizer.encode(text, add_special_tokens=specials)
            plain = tokenizer.encode(text, add_special_tokens=False)
            decoded = tokenizer.decode(plain, skip_special_tokens=False)
            if decoded != text:
                where = f"{rollouts.row_word} {r.source_row}"
                issues.append(RoundTripIssue(r.group, r.sample, where, text_field, text, decoded))
        response = replace(r, **filled)
        _check_token_fields(rollouts, response, lambda name: name, from_tokenizer=filled)
        responses.append(response)
    return Rollouts(rollouts.path, rollouts.format, responses), issues


def check_vocab(rollouts: Rollouts, vocab_size: int) -> None:
    """Raise `InputError` for the first token id outside `0 .. vocab_size - 1`.

    Rows without ids have nothing to check: call this after `tokenize_rollouts`.
    """
    for r in rollouts.responses:
        for name in ("prompt_ids", "response_ids"):
            ids = getattr(r, name) or []
            bad = next((i for i, tok in enumerate(ids) if tok >= vocab_size), None)
            if bad is not None:
                raise rollouts.error(
                    r.source_row,
                    f"token id {ids[bad]} at position {bad} is outside the checkpoint's "
                    f"vocabulary of size {vocab_size} (valid ids are 0 to {vocab_size - 1}).",
                    field=name,
                    hint="Were these rollouts made with another model's tokenizer?",
                )


def _read_jsonl(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    """(line number, object) for every non-blank line."""
    try:
        # Split on "\n" only: splitlines() would also break inside a string at U+2028 and kin.
        lines = path.read_text(encoding="utf-8").split("\n")
    except UnicodeDecodeError as err:
        raise InputError(f"not UTF-8 text ({err.reason} at byte {err.start})", path=path) from None
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as err:
            raise InputError(
                f"malformed JSON: {err.msg} at column {err.colno}.",
                path=path,
                line=number,
                hint="Each line must hold one JSON object (JSON Lines).",
            ) from None
        if not isinstance(record, dict):
            raise InputError(
                f"expected a JSON object, got {_describe(record)}.", path=path, line=number
            )
        yield number, record


def _read_parquet(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    """(row number, record) for every row; nulls become None, so they read as absent."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(path)
    except (pa.ArrowException, OSError) as err:
        raise InputError(f"not a readable Parquet file ({err})", path=path) from None
    yield from enumerate(table.to_pylist())


class _Row:
    """One raw record being turned into a `Response`; its errors name the key the file used."""

    def __init__(
        self,
        rollouts: Rollouts,
        source_row: int,
        record: dict[str, Any],
        keys: dict[str, tuple[str, ...]],
    ) -> None:
        self.rollouts = rollouts
        self.source_row = source_row
        self.record = record
        self.keys = keys

    def key(self, name: str) -> str:
        """The key the file used for canonical field `name` (its first spelling if absent)."""
        present = [k for k in self.keys[name] if self.record.get(k) is not None]
        return (present or self.keys[name])[0]

    def value(self, name: str) -> Any:
        """The value of canonical field `name`, None when absent or null."""
        return self.record.get(self.key(name))

    def fail(self, name: str, message: str, hint: str | None = None) -> InputError:
        return self.rollouts.error(self.source_row, message, field=self.key(name), hint=hint)

    def parse(self, verl_groups: dict[tuple[int, str], str] | None) -> Response:
        """Validate every field and build the `Response` (sample numbers are filled in later).

        `verl_groups` is given for verl dumps: it maps (step, input) to the group id, shared
        across rows, for rows without a `uid`.
        """
        required = _REQUIRED if verl_groups is None else _REQUIRED[1:]
        for alternatives in (*required, _REQUIRED_REWARD):
            self.require(alternatives)
        fields: dict[str, Any] = {
            "prompt": self.parse_text("prompt"),
            "response": self.parse_text("response"),
            "prompt_ids": self.parse_list("prompt_ids", _token_id),
            "response_ids": self.parse_list("response_ids", _token_id),
            "reward": self.parse_scalar("reward", _finite),
            "token_rewards": self.parse_list("token_rewards", _finite),
            "mask": self.parse_list("mask", _mask_value),
            "step": self.parse_scalar("step", _integer),
            "logprobs": self.parse_list("logprobs", _finite),
            "sum_pi2": self.parse_list("sum_pi2", _finite),
            "is_weights": self.parse_list("is_weights", _finite),
        }
        if fields["response"] == "" and fields["response_ids"] is None:
            raise self.fail("response", "the response is empty: there is no token to score.")
        temperature = self.parse_scalar("temperature", _positive)
        group = self.parse_scalar("group", _group_id)
        if group is None:  # a verl row without uid: group by (step, input)
            group = self.verl_group(verl_groups, fields["step"])
        return Response(
            group=group,
            sample=0,
            source_row=self.source_row,
            temperature=1.0 if temperature is None else temperature,
            **fields,
        )

    def require(self, alternatives: tuple[str, ...]) -> None:
        """Raise unless one of `alternatives` is present, suggesting a close misspelling."""
        if any(self.value(name) is not None for name in alternatives):
            return
        wanted = [k for name in alternatives for k in self.keys[name]]
        known = {k for spellings in self.keys.values() for k in spellings}
        unknown = [k for k in self.record if k not in known]
        near = [m for k in wanted for m in difflib.get_close_matches(k, unknown, n=1, cutoff=0.7)]
        found = f" (found '{near[0]}': misspelled?)" if near else ""
        others = "".join(f" or '{k}'" for k in wanted[1:])
        raise self.fail(alternatives[0], f"missing required field '{wanted[0]}'{others}{found}.")

    def parse_text(self, name: str) -> str | None:
        value = self.value(name)
        if value is None:
            return None
        if not isinstance(value, str):
            raise self.fail(name, f"expected a string, got {_describe(value)}.")
        return value

    def parse_scalar(self, name: str, check: Callable[[Any], Any]) -> Any:
        value = self.value(name)
        if value is None:
            return None
        try:
            return check(value)
        except ValueError as err:
            raise self.fail(name, f"{err}.") from None

    def parse_list(self, name: str, check: Callable[[Any], Any]) -> list[Any] | None:
        values = self.value(name)
        if values is None:
            return None
        if not isinstance(values, list):
            raise self.fail(name, f"expected a list, got {_describe(values)}.")
        out = []
        for i, v in enumerate(values):
            try:
                out.append(check(v))
            except ValueError as err:
                raise self.fail(name, f"entry {i}: {err}.") from None
        return out

    def verl_group(self, verl_groups: dict[tuple[int, str], str] | None, step: int | None) -> str:
        """`s{step}:{k}`, k counting the distinct inputs of that step in order of appearance."""
        assert verl_groups is not None  # only rows of non-verl files must have a group
        if step is None:
            raise self.fail(
                "step",
                "missing required field 'step'.",
                hint="verl dumps without 'uid' group responses by (step, input).",
            )
        key = (step, self.value("prompt"))
        if key not in verl_groups:
            k = sum(1 for s, _ in verl_groups if s == step)
            verl_groups[key] = f"s{step}:{k}"
        return verl_groups[key]


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
            raise rollouts.error(
                r.source_row,
                f"the {what} has no tokens{origin(name)}: the first response token is predicted "
                "from the last prompt token, so both must be non-empty.",
                field=key(name),
            )
    if r.response_ids is None:
        return
    for name in TOKEN_FIELDS:
        values = getattr(r, name)
        if values is not None and len(values) != len(r.response_ids):
            raise rollouts.error(
                r.source_row,
                f"has {len(values)} entries but the response has {len(r.response_ids)} "
                f"tokens{origin('response_ids')}: per-token fields need one entry per "
                "response token.",
                field=key(name),
            )


def _number_samples(responses: list[Response]) -> list[Response]:
    """Set each response's 0-based position within its group, in file order."""
    seen: dict[str, int] = {}
    out = []
    for r in responses:
        out.append(replace(r, sample=seen.get(r.group, 0)))
        seen[r.group] = out[-1].sample + 1
    return out


# Value checks: return the clean value or raise ValueError saying what is wrong.


def _describe(value: Any) -> str:
    text = repr(value)
    return f"{type(value).__name__} {text if len(text) <= 40 else text[:37] + '...'}"


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _finite(value: Any) -> float:
    if not _is_number(value):
        raise ValueError(f"expected a number, got {_describe(value)}")
    if not math.isfinite(value):
        raise ValueError(f"expected a finite number, got {value}")
    return float(value)


def _positive(value: Any) -> float:
    if _finite(value) <= 0:
        raise ValueError(f"expected a positive number, got {value}")
    return float(value)


def _integer(value: Any) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise ValueError(f"expected an integer, got {_describe(value)}")
    return value


def _token_id(value: Any) -> int:
    if _integer(value) < 0:
        raise ValueError(f"token ids are non-negative, got {value}")
    return value


def _mask_value(value: Any) -> int:
    # Booleans are accepted: a Parquet writer may well store the mask as bool.
    if not isinstance(value, (int, float)) or value not in (0, 1):
        raise ValueError(f"mask values are 0 or 1, got {_describe(value)}")
    return int(value)


def _group_id(value: Any) -> str:
    if isinstance(value, str) or (isinstance(value, int) and not isinstance(value, bool)):
        return str(value)
    raise ValueError(f"expected a string or an integer, got {_describe(value)}")
