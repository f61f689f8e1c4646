"""What `--rollouts` names, as a list of files in step order, and the `--steps A-B` filter.

`--rollouts` is one file, a directory or a glob pattern:
- a directory stands for every `*.jsonl` and `*.parquet` file directly in it (verl's
  `trainer.rollout_data_dir` holds one `{step}.jsonl` per step); a TRL output directory, which
  holds its completion logs in `completions/`, stands for those;
- a pattern (`dumps/*.jsonl`, `run/completions/completions_0000[1-5].parquet`) for the files it
  matches.
Files are ordered by the last number in their name (`9.jsonl` before `10.jsonl`,
`completions_00002.parquet` before `completions_00010.parquet`), then by name.
"""

from __future__ import annotations

import glob
import re
from dataclasses import dataclass, replace
from pathlib import Path

from otb_diag.errors import InputError
from otb_diag.io.rollouts.readers import READERS, Rollouts, read_rollouts

_GLOB_CHARS = re.compile(r"[*?\[]")
_NUMBER = re.compile(r"(\d+)")
# Where TRL writes its completion logs under `output_dir` (GRPOConfig.log_completions).
TRL_COMPLETIONS_DIR = "completions"


@dataclass(frozen=True)
class StepRange:
    """Inclusive range of training steps `first..last` (`--steps A-B`, or `A` alone)."""

    first: int
    last: int

    def __contains__(self, step: object) -> bool:
        return isinstance(step, int) and self.first <= step <= self.last

    def __str__(self) -> str:
        return f"{self.first}-{self.last}"


def parse_steps(text: str | None) -> StepRange | None:
    """`"A-B"` or `"A"` as a `StepRange`; None for None. Bad text is an `InputError`."""
    if text is None:
        return None
    match = re.fullmatch(r"\s*(\d+)\s*(?:-\s*(\d+)\s*)?", text)
    if match is None:
        raise InputError(
            f"expected a step range such as 100-200 (or one step, 150), got {text!r}",
            field="--steps",
        )
    first = int(match[1])
    last = int(match[2]) if match[2] is not None else first
    if last < first:
        raise InputError(f"the range {text!r} ends before it starts", field="--steps")
    return StepRange(first, last)


def file_step(path: Path) -> int | None:
    """The last number in a file's name (`12.jsonl` -> 12, `completions_00003.parquet` -> 3)."""
    numbers = _NUMBER.findall(path.stem)
    return int(numbers[-1]) if numbers else None


def _step_order(path: Path) -> tuple[int, int, str]:
    step = file_step(path)
    return (0, step, path.name) if step is not None else (1, 0, path.name)


def expand_rollouts(spec: str | Path) -> list[Path]:
    """The rollout files `spec` names (a file, a directory or a glob), in step order.

    A single file is returned as is (its type is checked when it is read); a directory or a
    pattern that names no rollout file is an `InputError`."""
    path = Path(spec)
    if path.is_dir():
        trl = path / TRL_COMPLETIONS_DIR
        directory = trl if trl.is_dir() and not _rollout_files(path) else path
        files = _rollout_files(directory)
        if not files:
            raise InputError(
                "the directory holds no rollout files (*.jsonl, *.parquet)",
                path=path,
                hint="Point --rollouts at verl's trainer.rollout_data_dir, a TRL output_dir "
                "(with completions/) or a file.",
            )
        return sorted(files, key=_step_order)
    if not path.exists() and _GLOB_CHARS.search(str(spec)):
        matches = [Path(m) for m in glob.glob(str(spec)) if Path(m).is_file()]
        files = [m for m in matches if m.suffix.lower() in READERS]
        if not files:
            raise InputError(
                f"the pattern matches no rollout file (*.jsonl, *.parquet; {len(matches)} "
                "other files)",
                path=path,
            )
        return sorted(files, key=_step_order)
    return [path]


# Settings files written beside rollouts (`rollouts sample` writes manifest.json next to its
# pools), never rollouts themselves.
NOT_ROLLOUTS = frozenset({"manifest.json"})


def _rollout_files(directory: Path) -> list[Path]:
    return [
        p
        for p in directory.iterdir()
        if p.is_file() and p.suffix.lower() in READERS and p.name not in NOT_ROLLOUTS
    ]


def read_rollout_set(
    spec: str | Path,
    *,
    steps: StepRange | None = None,
    reward_columns: list[str] | None = None,
) -> Rollouts:
    """Every rollout file `spec` names, read and validated, as one `Rollouts` in step order,
    keeping the rows whose `step` lies in `steps` (all rows when None).

    A group id used in more than one file is qualified by its file's name (`12/g0`): files are
    separate batches, and their groups are different prompts' samples."""
    files = expand_rollouts(spec)
    parts = [read_rollouts(f, reward_columns) for f in files]
    owners: dict[str, set[Path]] = {}
    for part in parts:
        for r in part.responses:
            owners.setdefault(r.group, set()).add(part.path)
    responses = [
        replace(r, group=f"{part.path.stem}/{r.group}") if len(owners[r.group]) > 1 else r
        for part in parts
        for r in part.responses
    ]
    if steps is not None:
        unstepped = next((r for r in responses if r.step is None), None)
        if unstepped is not None:
            where = parts[0].error_at(unstepped, "")
            raise InputError(
                f"--steps {steps} needs a step on every row; this row has none",
                path=where.path,
                line=where.line,
                row=where.row,
                field="step",
            )
        responses = [r for r in responses if r.step in steps]
        if not responses:
            raise InputError(f"no rollout row has a step in {steps}", path=Path(spec))
    formats = {p.format for p in parts}
    clamped = {k: sum(p.clamped[k] for p in parts) for k in parts[0].clamped}
    return Rollouts(
        Path(spec),
        formats.pop() if len(formats) == 1 else "mixed",
        responses,
        clamped=clamped,
        files=files,
    )
