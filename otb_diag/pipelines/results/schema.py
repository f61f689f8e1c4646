"""The version of summary.json and the one way from its JSON back to a typed result: every field
present, nested records rebuilt as their dataclasses, a file of another version refused."""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, TypeVar

from otb_diag.errors import InputError

# Bumped whenever a field of a result class is added, renamed or changes meaning. 1: the first
# versioned summary.json (the content of the unversioned files plus this field). 2:
# variance-compare's `paper_claim` gives both readings of the paper's headline, with N′, its
# range and the saving at equal variance as fields (`results/variance.py:ClaimVerdict`);
# dynamics' `budget`, the logged split pooled over the run, and collapse.json's `arms` (the
# comparison at equal tokens); energy's empty responses and zero-tail tokens, verl's proxies in
# verl's convention (issue 34). 3: dynamics' `otb` holds each metric family's values of one
# step, the last that logged the family, and `otb_steps` which step (issue 40). 4: the
# recommendation's `reference` holds the numbers its sentence reads (its knee in prompts and the
# tokens' interval), so the sentence can be rewritten from the record alone
# (`maths/noise/knee.py:recommendation_text`; issue 42). 5: variance-compare's verdicts are read
# off intervals, in three words ("holds", "does not hold", "not resolved") or "no signal": the
# headline rows carry the intervals of OTB/mean, N′ and the saving and `otb_below_mean`,
# `paper_claim` both readings' verdicts (`saving_verdict`, `verdict`) with N′'s interval, the
# recommendation its knee's `verdict`; `signal` counts the groups whose rewards carry one, and a
# run with none writes no table (`knee` null; issue 46).
SCHEMA_VERSION = 5

T = TypeVar("T")


# A field's metadata key: the field is left out of the JSON when it is None (`absent()`).
_ABSENT = "absent_when_none"


def absent() -> Any:
    """A record field that files hold only when it has a value: None when the file lacks the
    key, and left out of `to_json` when None (the files as they were written before the records
    were typed)."""
    return dataclasses.field(default=None, metadata={_ABSENT: True})


@dataclass(frozen=True)
class FileRecord:
    """One file of a multi-file rollouts input, resolved, with its SHA-256."""

    path: str
    sha256: str


@dataclass(frozen=True)
class RolloutsRecord:
    """The rollouts a run read (`io/loading.py:rollouts_record`): path and format, with the
    SHA-256 of its one file or, for several files, each file's."""

    path: str
    format: str
    sha256: str | None = absent()  # one file
    files: list[FileRecord] | None = absent()  # several files


@dataclass(frozen=True)
class CheckpointRecord:
    """A checkpoint a run read (`io/checkpoint.py:checkpoint_record`): path, hash, what was
    hashed, and its training step (None: not in its name)."""

    path: str
    sha256: str
    hashed: str
    step: int | None


@dataclass(frozen=True)
class RunInputs:
    """What a run read: the rollouts and checkpoints as `io/loading.py` records them (path,
    SHA-256, ...), shared by the results of `energy` and `variance-compare`."""

    rollouts: RolloutsRecord
    checkpoints: list[CheckpointRecord]

    @classmethod
    def of(cls, rollouts: dict[str, Any], checkpoints: list[dict[str, Any]]) -> RunInputs:
        """From io's records (`io/loading.py:rollouts_record`, `io/checkpoint.py:
        checkpoint_record`)."""
        return cls(build(RolloutsRecord, rollouts), build(list[CheckpointRecord], checkpoints))

    @property
    def rollouts_path(self) -> str:
        return self.rollouts.path

    @property
    def rollouts_sha256(self) -> str | None:
        return self.rollouts.sha256

    @property
    def checkpoint_paths(self) -> list[str]:
        return [c.path for c in self.checkpoints]


@dataclass(frozen=True)
class RewardSignal:
    """How many groups' rewards carry a signal a baseline can act on
    (`otb_diag/io/loading.py:RolloutSet.groups_with_signal`): in a group whose members' returns
    are all one value, every group baseline (mean, RLOO, OTB, ...) gives zero advantages, so
    the group tells no baseline from another."""

    groups: int
    groups_with_signal: int

    @classmethod
    def of(cls, flags: Sequence[bool]) -> RewardSignal:
        """From each group's flag (`RolloutSet.groups_with_signal`)."""
        return cls(len(flags), sum(map(bool, flags)))

    @property
    def carries_any(self) -> bool:
        return self.groups_with_signal > 0

    @property
    def share(self) -> float:
        """The share of the groups that carry a signal."""
        return self.groups_with_signal / self.groups if self.groups else 0.0

    def sentence(self) -> str | None:
        """Why nothing can be compared, or the share of the groups that carry a signal; None
        when every group does."""
        if not self.carries_any:
            return (
                f"no signal: each of the {self.groups:,} groups has equal rewards within it, so "
                "every group baseline gives zero advantages and no baseline can be told from "
                "another"
            )
        if self.groups_with_signal == self.groups:
            return None
        equal = self.groups - self.groups_with_signal
        share = f"{self.share:.0%}".replace("%", " %")
        return (
            f"partial signal: {self.groups_with_signal:,} of {self.groups:,} groups ({share}) "
            f"carry a reward signal; the rest ({equal:,}) have equal rewards within their group "
            "(zero advantages under every group baseline)"
        )


def counted(n: int, noun: str, plural: str | None = None) -> str:
    """`n` and the noun in its number, as the summaries write counts: "1 token", "6 tokens",
    "2 batches" (`plural`, where adding an s is wrong)."""
    return f"{n:,} {noun if n == 1 else plural or noun + 's'}"


def groups_of_one(singletons: int, groups: int) -> str | None:
    """The warning where `singletons` of the `groups` hold one response (`rollouts sample
    --n 1`): a group baseline is 0 there (nothing else in the group to compare with), so every
    group baseline's advantages equal `none`'s, and the group's rewards give no baseline signal.
    None when no group is of one."""
    if not singletons:
        return None
    which = (
        f"every one of the {groups:,} groups holds"
        if singletons == groups
        else f"{singletons:,} of the {groups:,} groups hold"
    )
    return (
        f"warning: {which} one response: with groups of one every group baseline (mean, "
        "rloo, otb, ...) is 0 and equals none, so the rewards give no group baseline signal; "
        "sample pools of 2 or more responses per prompt (rollouts sample --n)"
    )


@dataclass(frozen=True)
class Distributed:
    """The processes that ran a command: how many, and the tokens each measured or generated."""

    world_size: int
    rank_tokens: list[int]


class Versioned:
    """What every command's result shares (mixed into its frozen dataclass): `to_json()`, its
    record file's content with the schema version, and `from_json`, the one way back."""

    command: ClassVar[str]

    def to_json(self) -> dict[str, Any]:
        return to_json(self)

    @classmethod
    def from_json(cls: type[T], data: Any, path: Path) -> T:
        return from_json(cls, data, path)


def to_json(result: Any) -> dict[str, Any]:
    """summary.json's content: the version, the command, then the fields in declaration order."""
    return {"schema_version": SCHEMA_VERSION, "command": result.command, **plain(result)}


def plain(value: Any) -> Any:
    """`value` as the JSON it is written as, and read back: records as dicts of their fields in
    declaration order (an `absent()` field that is None left out), tuples as lists, lists and
    dicts item by item."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {
            f.name: plain(getattr(value, f.name))
            for f in dataclasses.fields(value)
            if not (f.metadata.get(_ABSENT) and getattr(value, f.name) is None)
        }
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    return value


def from_json(cls: type[T], data: Any, path: Path) -> T:
    """`cls` rebuilt from a record file's `data` (summary.json, manifest.json, ...); an
    unversioned or other-version file, or one missing a field, is an `InputError` naming `path`
    and saying to re-run the command."""
    command = data.get("command") if isinstance(data, dict) else None
    rerun = f"Re-run `otb-diag {command or '...'}` to rewrite it with this version of otb-diag."
    version = data.get("schema_version") if isinstance(data, dict) else None
    if version != SCHEMA_VERSION:
        found = "no schema_version" if version is None else f"schema_version {version}"
        raise InputError(
            f"this {path.name} has {found}; this otb-diag reads version {SCHEMA_VERSION}.",
            path=path,
            hint=rerun,
        )
    try:
        return build(cls, data)
    except (KeyError, TypeError) as err:
        raise InputError(f"{path.name} lacks a field or has a wrong one ({err})", path=path,
                         hint=rerun) from None  # fmt: skip


def build(tp: Any, value: Any) -> Any:
    """`value` (parsed JSON, or a record as a plain dict) as type `tp`: dataclasses field by
    field (a field with a default may be absent: it takes the default), `list[X]`,
    `tuple[X, ...]`, `tuple[X, Y]` and `dict[str, X]` item by item, `X | None` as X unless
    None (`X | Y`: the first that `value` builds); anything else as it is. A missing field is
    a `KeyError`, a wrong shape a `TypeError`."""
    if dataclasses.is_dataclass(tp) and isinstance(tp, type):
        if not isinstance(value, dict):
            raise TypeError(f"{tp.__name__} needs an object, got {type(value).__name__}")
        hints = typing.get_type_hints(tp)
        return tp(
            **{
                f.name: build(hints[f.name], value[f.name])
                for f in dataclasses.fields(tp)
                if f.name in value or _required(f)
            }
        )
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        if value is None:
            return None
        *first, last = [a for a in args if a is not type(None)]
        for inner in first:  # records of another shape: the first whose fields `value` has
            try:
                return build(inner, value)
            except (KeyError, TypeError):
                continue
        return build(last, value)
    if origin is list:
        return [build(args[0], v) for v in value]
    if origin is tuple:
        items = args[:1] * len(value) if args[1:] == (...,) else args
        if len(items) != len(value):
            raise TypeError(f"{tp} needs {len(items)} items, got {len(value)}")
        return tuple(build(t, v) for t, v in zip(items, value, strict=True))
    if origin is dict:
        return {k: build(args[1], v) for k, v in value.items()}
    return value


def _required(f: dataclasses.Field[Any]) -> bool:
    return f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
