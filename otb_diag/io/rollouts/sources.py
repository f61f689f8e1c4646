"""What `--rollouts` names, as a list of files in step order.

`--rollouts` is one file, a directory or a glob pattern:
- a directory stands for every `*.jsonl` and `*.parquet` file directly in it (verl's
  `trainer.rollout_data_dir` holds one `{step}.jsonl` per step); a trainer's output directory
  that keeps its dumps in a sub-directory (TRL: `completions/`, `Trainer.dump_dir`) stands for
  those;
- a pattern (`dumps/*.jsonl`, `run/completions/completions_0000[1-5].parquet`) for the files it
  matches.
Files are ordered by the last number in their name (`9.jsonl` before `10.jsonl`,
`completions_00002.parquet` before `completions_00010.parquet`), then by name.
"""

from __future__ import annotations

import glob
import re
from pathlib import Path

from otb_diag.errors import InputError
from otb_diag.io.rollouts.records import READERS
from otb_diag.io.trainers import TRAINERS

_GLOB_CHARS = re.compile(r"[*?\[]")
_NUMBER = re.compile(r"(\d+)")


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
        dumps = [path / t.dump_dir for t in TRAINERS if t.dump_dir is not None]
        found = [d for d in dumps if d.is_dir()]
        directory = found[0] if found and not _rollout_files(path) else path
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
