"""The version of summary.json and the one way from its JSON back to a typed result: every field
present, nested records rebuilt as their dataclasses, a file of another version refused."""

from __future__ import annotations

import dataclasses
import types
import typing
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
# verl's convention (issue 34).
SCHEMA_VERSION = 2

T = TypeVar("T")


@dataclass(frozen=True)
class RunInputs:
    """What a run read: the rollouts and checkpoints as `io/loading.py` records them (path,
    SHA-256, ...), shared by the results of `energy` and `variance-compare`."""

    rollouts: dict[str, Any]
    checkpoints: list[dict[str, Any]]

    @property
    def rollouts_path(self) -> str:
        return str(self.rollouts["path"])

    @property
    def rollouts_sha256(self) -> str | None:
        return self.rollouts.get("sha256")

    @property
    def checkpoint_paths(self) -> list[str]:
        return [c["path"] for c in self.checkpoints]


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
    return {
        "schema_version": SCHEMA_VERSION,
        "command": result.command,
        **dataclasses.asdict(result),
    }


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
        return _build(cls, data)
    except (KeyError, TypeError) as err:
        raise InputError(f"{path.name} lacks a field or has a wrong one ({err})", path=path,
                         hint=rerun) from None  # fmt: skip


def _build(tp: Any, value: Any) -> Any:
    """`value` (parsed JSON) as type `tp`: dataclasses field by field (a field with a default
    may be absent: it takes the default), lists of them item by item, `X | None` as X unless
    None; anything else as it is."""
    if dataclasses.is_dataclass(tp) and isinstance(tp, type):
        hints = typing.get_type_hints(tp)
        return tp(
            **{
                f.name: _build(hints[f.name], value[f.name])
                for f in dataclasses.fields(tp)
                if f.name in value or f.default is dataclasses.MISSING
            }
        )
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        if value is None:
            return None
        (inner,) = [a for a in typing.get_args(tp) if a is not type(None)]
        return _build(inner, value)
    if origin is list:
        (item,) = typing.get_args(tp)
        return [_build(item, v) for v in value]
    return value
