"""Rollouts against a checkpoint's tokenizer: `tokenize_rollouts` fills in missing token ids
from the text (and reports the texts that do not round-trip), `check_vocab` checks every id
against the checkpoint's vocabulary. Entered after the rollouts are read (`readers.py`), once a
checkpoint is loaded (`otb_diag/io/batches.py:checkpoint_batch`)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Protocol

from otb_diag.errors import InputError
from otb_diag.io.rollouts.readers import Rollouts, check_token_fields
from otb_diag.io.rollouts.rows import Response


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
        check_token_fields(rollouts, response, lambda name: name, from_tokenizer=filled)
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
