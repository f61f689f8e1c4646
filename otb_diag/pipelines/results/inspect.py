"""The result of `otb-diag rollouts inspect`: what `--json` prints as fields, and the aligned
block of text it prints otherwise."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from otb_diag.pipelines.results import schema


@dataclass(frozen=True)
class GroupSizes:
    """Responses per group: spread, and how many groups have each size (size as a string)."""

    min: float
    median: float
    max: float
    counts: dict[str, int]


@dataclass(frozen=True)
class TokenLengths:
    """Response lengths in tokens; `max_over_min` is ≥ 1 (empty responses are refused)."""

    total: float
    min: float
    p10: float
    median: float
    p90: float
    max: float
    mean: float
    max_over_min: float


@dataclass(frozen=True)
class RewardStats:
    """The outcome rewards; the shares only when every reward is 0 or 1, the histogram (value
    as a string -> responses) only for a few distinct values."""

    mean: float
    std: float
    min: float
    max: float
    binary: bool
    share_one: float | None
    share_zero: float | None
    histogram: dict[str, int] | None


@dataclass(frozen=True)
class GroupMeans:
    """The spread of the groups' mean rewards (pass rates for binary rewards)."""

    min: float
    median: float
    mean: float
    max: float


@dataclass(frozen=True)
class UniformGroups:
    """`count` of the `of` groups of two or more whose rewards are all equal; `share` None when
    there are no such groups; `by_value`: the shared reward (as a string) -> groups."""

    count: int
    of: int
    share: float | None
    by_value: dict[str, int]


@dataclass(frozen=True)
class MaskedTokens:
    """Response tokens with mask 0 (tool output): `count` of `of`."""

    count: int
    of: int
    share: float


@dataclass(frozen=True)
class InspectResult(schema.Versioned):
    """What `otb-diag rollouts inspect` found in a rollouts file (`to_json()` is its `--json`).
    Token statistics are None when some response has no token ids. The JSON names
    `rollouts_format` "format" (here the name is taken by the method)."""

    command: ClassVar[str] = "rollouts inspect"

    path: str
    rollouts_format: str  # "jsonl", "parquet", a trainer's dump, ...
    files: int
    rows: int
    groups: int
    group_size: GroupSizes
    singleton_groups: list[str]
    response_tokens: TokenLengths | None
    reward: RewardStats
    group_mean_reward: GroupMeans
    uniform_groups: UniformGroups
    masked_tokens: MaskedTokens | None
    temperatures: list[float]
    steps: list[int]
    clamped_round_off: dict[str, int]
    fields_present: dict[str, int]  # field name -> rows that carry it
    round_trip_issues: list[str]  # rows whose text does not survive the tokenizer's round trip

    def to_json(self) -> dict[str, Any]:
        return {_JSON_NAMES.get(k, k): v for k, v in super().to_json().items()}

    @classmethod
    def from_json(cls, data: Any, path: Path) -> InspectResult:
        if isinstance(data, dict):
            back = {v: k for k, v in _JSON_NAMES.items()}
            data = {back.get(k, k): v for k, v in data.items()}
        return schema.from_json(cls, data, path)

    def format(self) -> str:
        """A compact, aligned block of text for the terminal."""
        sizes, tokens, masked = self.group_size, self.response_tokens, self.masked_tokens
        lines = [
            ("rollouts", f"{self.path} ({self.rollouts_format})"),
            ("rows", str(self.rows)),
            (
                "groups",
                f"{self.groups}; size min {_n(sizes.min)}, median {_n(sizes.median)}, "
                f"max {_n(sizes.max)} ("
                + ", ".join(f"{n} of size {size}" for size, n in sizes.counts.items())
                + ")",
            ),
            ("groups of one", _ids(self.singleton_groups)),
            (
                "response tokens",
                "unknown (no token ids: give a checkpoint to tokenize the text)"
                if tokens is None
                else f"min {_n(tokens.min)}, p10 {_n(tokens.p10)}, median {_n(tokens.median)}, "
                f"p90 {_n(tokens.p90)}, max {_n(tokens.max)}, mean {_n(tokens.mean)}; "
                f"max/min {_n(tokens.max_over_min)}",
            ),
            *self._reward_lines(),
            (
                "masked tokens",
                "unknown (no token ids)"
                if masked is None
                else f"{masked.count} of {masked.of} ({_pct(masked.share)})",
            ),
            ("temperatures", ", ".join(_n(t) for t in self.temperatures)),
            (
                "steps",
                f"{len(self.steps)} ({self.steps[0]} to {self.steps[-1]})"
                if self.steps
                else "none recorded",
            ),
            (
                "fields present",
                ", ".join(
                    name if n == self.rows else f"{name} ({n}/{self.rows})"
                    for name, n in self.fields_present.items()
                    if n
                ),
            ),
        ]
        width = max(len(label) for label, _ in lines)
        return "\n".join(f"{label:<{width}}  {value}" for label, value in lines)

    def _reward_lines(self) -> list[tuple[str, str]]:
        """The reward, its values, the per-group means and the all-equal groups, labelled."""
        reward, means, uniform = self.reward, self.group_mean_reward, self.uniform_groups
        reward_line = (
            f"mean {_n(reward.mean)}, std {_n(reward.std)}, min {_n(reward.min)}, "
            f"max {_n(reward.max)}"
        )
        if reward.binary and reward.share_one is not None:
            reward_line += f"; binary: {_pct(reward.share_one)} are 1"
        lines = [("reward", reward_line)]
        if reward.histogram is not None:
            lines.append(
                ("reward values", ", ".join(f"{v}: {n}" for v, n in reward.histogram.items()))
            )
        lines.append(
            (
                "pass rate / group" if reward.binary else "mean reward / group",
                f"min {_n(means.min)}, median {_n(means.median)}, mean {_n(means.mean)}, "
                f"max {_n(means.max)}",
            )
        )
        lines.append(
            (
                "all-equal groups",
                "no groups of two or more"
                if uniform.share is None
                else f"{uniform.count} of {uniform.of} ({_pct(uniform.share)})"
                + "".join(f"; reward {v}: {n}" for v, n in uniform.by_value.items())
                + (" (no signal under a group baseline)" if uniform.count else ""),
            )
        )
        return lines


# A field's name in the JSON where it differs from the attribute's.
_JSON_NAMES = {"rollouts_format": "format"}


def _n(x: float) -> str:
    """A number without trailing noise: 4.0 -> "4", 0.123456 -> "0.1235"."""
    return f"{x:.4g}"


def _pct(share: float) -> str:
    return f"{100 * share:.1f}%"


def _ids(ids: list[str], shown: int = 5) -> str:
    if not ids:
        return "none"
    more = f", ... (+{len(ids) - shown} more)" if len(ids) > shown else ""
    return f"{len(ids)}: " + ", ".join(ids[:shown]) + more
