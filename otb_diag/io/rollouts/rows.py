"""One row of a rollout file: the `Response` record and how a raw record (a JSON object or a
Parquet row, any accepted spelling of each field) is validated into one.

Every problem raises the `InputError` the reading file's `Rollouts.error` makes, naming the line or
row and the key the file used.
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from otb_diag.errors import InputError
from otb_diag.maths.estimators.registry import BASELINES, baseline_names

# Canonical field name -> keys accepted for it, in order of preference.
KEYS: dict[str, tuple[str, ...]] = {
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
    "trainer_advantage": ("trainer_advantage",),
    "advantage_estimator": ("advantage_estimator",),
}

# Each entry is one requirement, satisfied by any of its fields.
_REQUIRED = (("group",), ("prompt", "prompt_ids"), ("response", "response_ids"))
_REQUIRED_REWARD = ("reward", "token_rewards")


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
    # The advantage the trainer used: one number per response (TRL) or one per token.
    trainer_advantage: float | list[float] | None = None
    # The registry baseline and options that produced it (attach's dumps): what the audit checks.
    advantage_estimator: tuple[str, dict[str, Any]] | None = None
    # A conversational prompt (TRL): the messages, to which --chat-template applies the template.
    prompt_messages: list[dict[str, str]] | None = None
    source_path: str | None = field(default=None, compare=False)  # the file it came from


class RawRow:
    """One raw record being turned into a `Response`; its errors name the key the file used."""

    def __init__(
        self,
        error: Callable[..., InputError],
        source_row: int,
        record: dict[str, Any],
        keys: dict[str, tuple[str, ...]],
    ) -> None:
        self.error = error  # `Rollouts.error` of the file being read
        self.source_row = source_row
        self.record = record
        self.keys = keys
        self._used: dict[str, str] = {}  # canonical name -> key, as `key` finds them

    def key(self, name: str) -> str:
        """The key the file used for canonical field `name` (its first spelling if absent)."""
        used = self._used.get(name)
        if used is None:
            spellings = self.keys[name]
            get = self.record.get
            used = next((k for k in spellings if get(k) is not None), spellings[0])
            self._used[name] = used
        return used

    def value(self, name: str) -> Any:
        """The value of canonical field `name`, None when absent or null."""
        return self.record.get(self.key(name))

    def fail(self, name: str, message: str, hint: str | None = None) -> InputError:
        return self.error(self.source_row, message, field=self.key(name), hint=hint)

    def parse(
        self, step_groups: dict[tuple[int, str], str] | None, source_path: str | None = None
    ) -> Response:
        """Validate every field and build the `Response` (sample numbers are filled in later).

        `step_groups` is given for trainer dumps (`otb_diag/io/trainers/`): it maps (step,
        prompt) to the group id, shared across rows, for rows without one. `source_path` is the
        file's path, for messages.
        """
        required = _REQUIRED if step_groups is None else _REQUIRED[1:]
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
        temperature = self.parse_scalar("temperature", _positive)
        advantage = self.value("trainer_advantage")
        fields["trainer_advantage"] = (
            self.parse_list("trainer_advantage", _finite)
            if isinstance(advantage, list)
            else self.parse_scalar("trainer_advantage", _finite)
        )
        fields["advantage_estimator"] = self.parse_estimator()
        group = self.parse_scalar("group", _group_id)
        if group is None:  # a trainer dump's row without one: group by (step, prompt)
            group = self.step_group(step_groups, fields["step"])
        return Response(
            group=group,
            sample=0,
            source_row=self.source_row,
            temperature=1.0 if temperature is None else temperature,
            prompt_messages=self.record.get("prompt_messages"),
            source_path=source_path,
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

    def parse_estimator(self) -> tuple[str, dict[str, Any]] | None:
        """`advantage_estimator`, `{"baseline": name, "options": {option: value}}`, as (a
        registered baseline's name, its options of JSON scalars)."""
        value = self.value("advantage_estimator")
        if value is None:
            return None
        options = value.get("options", {}) if isinstance(value, dict) else None
        name = value.get("baseline") if isinstance(value, dict) else None
        scalars = isinstance(options, dict) and all(
            isinstance(v, (bool, int, float, str)) for v in options.values()
        )
        if not isinstance(name, str) or not scalars:
            raise self.fail(
                "advantage_estimator",
                'expected {"baseline": NAME, "options": {OPTION: VALUE, ...}}, got '
                f"{describe(value)}.",
            )
        if name not in BASELINES:
            raise self.fail(
                "advantage_estimator",
                f"unknown baseline '{name}'; known: {', '.join(baseline_names())}.",
            )
        return name, dict(options)

    def parse_text(self, name: str) -> str | None:
        value = self.value(name)
        if value is None:
            return None
        if not isinstance(value, str):
            raise self.fail(name, f"expected a string, got {describe(value)}.")
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
            raise self.fail(name, f"expected a list, got {describe(values)}.")
        bulk = _BULK.get(check)
        clean = bulk(values) if bulk is not None else None
        if clean is not None:
            return clean
        out = []
        for i, v in enumerate(values):
            try:
                out.append(check(v))
            except ValueError as err:
                raise self.fail(name, f"entry {i}: {err}.") from None
        return out

    def step_group(self, step_groups: dict[tuple[int, str], str] | None, step: int | None) -> str:
        """`s{step}:{k}`, k counting the distinct prompts of that step in order of appearance
        (verl dumps without `uid`, TRL completion logs)."""
        assert step_groups is not None  # only rows of trainer dumps may lack a group
        if step is None:
            raise self.fail(
                "step",
                "missing required field 'step'.",
                hint="Trainer dumps without 'uid' group responses by (step, prompt).",
            )
        key = (step, self.value("prompt"))
        if key not in step_groups:
            k = sum(1 for s, _ in step_groups if s == step)
            step_groups[key] = f"s{step}:{k}"
        return step_groups[key]


# Value checks: return the clean value or raise ValueError saying what is wrong.


def describe(value: Any) -> str:
    text = repr(value)
    return f"{type(value).__name__} {text if len(text) <= 40 else text[:37] + '...'}"


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _finite(value: Any) -> float:
    if not _is_number(value):
        raise ValueError(f"expected a number, got {describe(value)}")
    if not math.isfinite(value):
        raise ValueError(f"expected a finite number, got {value}")
    return float(value)


def _positive(value: Any) -> float:
    if _finite(value) <= 0:
        raise ValueError(f"expected a positive number, got {value}")
    return float(value)


def _integer(value: Any) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise ValueError(f"expected an integer, got {describe(value)}")
    return value


def _token_id(value: Any) -> int:
    if _integer(value) < 0:
        raise ValueError(f"token ids are non-negative, got {value}")
    return value


def _mask_value(value: Any) -> int:
    # Booleans are accepted: a Parquet writer may well store the mask as bool.
    if not isinstance(value, (int, float)) or value not in (0, 1):
        raise ValueError(f"mask values are 0 or 1, got {describe(value)}")
    return int(value)


def _group_id(value: Any) -> str:
    if isinstance(value, str) or (isinstance(value, int) and not isinstance(value, bool)):
        return str(value)
    raise ValueError(f"expected a string or an integer, got {describe(value)}")


# Whole-list versions of the per-entry checks, run by C-level builtins (a per-token Python call
# costs more than reading the file): each returns exactly the list the per-entry loop would
# build, or None when some entry might fail, and the loop then finds and names that entry.


def _bulk_token_ids(values: list[Any]) -> list[int] | None:
    if set(map(type, values)) <= {int} and (not values or min(values) >= 0):
        return values
    return None


def _bulk_finite(values: list[Any]) -> list[float] | None:
    types = set(map(type, values))
    if types <= {float} and all(map(math.isfinite, values)):
        return values
    if types <= {float, int} and all(map(math.isfinite, values)):
        return list(map(float, values))
    return None


def _bulk_mask(values: list[Any]) -> list[int] | None:
    if set(map(type, values)) <= {int, float, bool} and set(values) <= {0, 1}:
        return list(map(int, values))
    return None


_BULK: dict[Callable[[Any], Any], Callable[[list[Any]], list[Any] | None]] = {
    _token_id: _bulk_token_ids,
    _finite: _bulk_finite,
    _mask_value: _bulk_mask,
}
