"""What the index pass of `stream.index_rollouts` learns from each row of the set `--rollouts`
names (`sources.expand_rollouts`), with `--steps A-B` applied (`StepRange`), each file opened once
(`readers.open_rollouts`) and scanned one of two ways.

`scan_rows` decodes and validates every row: the errors come out in file order, before anything
is measured, and the clamped round-off is counted; a caller that wants every row as it is read
(`rollouts inspect`, the whole-set view `stream.read_set`) gets it through `on_row`, so the set
is decoded once.
`scan_columns` reads four columns of a plain Parquet file (no trainer dump) as Arrow arrays, a
batch at a time, without decoding rows: the group id (`group`, else `uid`), the response's size
(the length of `response_ids`, else of `response`), whether `prompt_ids` and `response_ids` are
there and whether `mask` holds a 0. It serves a caller that decodes every row later anyway
(`energy`: the reading pass validates each row it decodes, so nothing goes unchecked), and
returns None on anything it cannot settle from the columns (a missing column, a null or non-id
group, a column of an unexpected type): the same open file's rows are then scanned, which names
the problem. JSON Lines files and trainer dumps are always scanned by rows."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from otb_diag.errors import InputError
from otb_diag.io.rollouts.probability_checks import CLAMPED_FIELDS
from otb_diag.io.rollouts.readers import RolloutFile, Rollouts, open_rollouts
from otb_diag.io.rollouts.records import PARQUET_BATCH_ROWS
from otb_diag.io.rollouts.rows import KEYS, Response
from otb_diag.io.rollouts.sources import expand_rollouts
from otb_diag.knobs import StepRange, parse_steps

# Called with `(file position, the file's Rollouts without responses, row)` for every kept row,
# in set order, as the index pass reads it (one tuple: `list.append` collects them).
OnRow = Callable[[tuple[int, Rollouts, Response]], None]


class FileScan(NamedTuple):
    """What the index pass learns from one file: per row, `(file position, index in its file,
    group id, size, whether its step is wanted)`; over the wanted rows, whether all have token
    ids and whether some response holds tool output (mask 0); the file's format; its clamped
    round-off, None when its rows were not decoded (`scan_columns`)."""

    rows: list[tuple[int, int, str, int, bool]]
    has_ids: bool
    tool_output: bool
    format: str
    clamped: dict[str, int] | None


@dataclass
class RowScan:
    """The `FileScan`s of the set's files, in order, as one: `clamped` is None when some file's
    rows were not decoded (their round-off is then counted by the pass that decodes them)."""

    files: list[Path]
    rows: list[tuple[int, int, str, int, bool]] = field(default_factory=list)
    has_ids: bool = True
    tool_output: bool = False
    formats: set[str] = field(default_factory=set)
    clamped: dict[str, int] | None = field(default_factory=lambda: dict.fromkeys(CLAMPED_FIELDS, 0))

    def add(self, part: FileScan) -> None:
        self.rows += part.rows
        self.has_ids = self.has_ids and part.has_ids
        self.tool_output = self.tool_output or part.tool_output
        self.formats.add(part.format)
        if self.clamped is None or part.clamped is None:
            self.clamped = None
        else:
            self.clamped = {k: self.clamped[k] + part.clamped[k] for k in CLAMPED_FIELDS}


def scan_set(
    spec: str | Path,
    steps: str | None,
    reward_columns: list[str] | None,
    *,
    validate: bool = True,
    on_row: OnRow | None = None,
) -> RowScan:
    """The scan of the set `spec` names, keeping the rows whose step lies in `steps` ("A-B"; all
    rows when None; none is an `InputError`), each file opened once. A file's rows are decoded
    and validated (`scan_rows`) unless `validate` is False, no `steps` or `on_row` is given and
    the file is plain Parquet whose columns settle it (`scan_columns`)."""
    wanted = parse_steps(steps)
    scan = RowScan(expand_rollouts(spec))
    columns = not validate and wanted is None and on_row is None
    for f, path in enumerate(scan.files):
        opened = open_rollouts(path, reward_columns=reward_columns)
        plain = opened.plain_parquet if columns else None
        part = scan_columns(f, plain) if plain is not None else None
        scan.add(part if part is not None else _scan_rows(f, opened, wanted, on_row))
    if wanted is not None and not any(row[4] for row in scan.rows):
        raise InputError(f"no rollout row has a step in {wanted}", path=Path(spec))
    return scan


def _scan_rows(
    f: int, opened: RolloutFile, steps: StepRange | None, on_row: OnRow | None = None
) -> FileScan:
    """Every row of file `f` decoded and validated, in file order; a row without a step is an
    `InputError` when `steps` is given. Each wanted row is handed to `on_row` as it is read."""
    shell = opened.rollouts
    rows: list[tuple[int, int, str, int, bool]] = []
    has_ids, tool_output = True, False
    for local, r in opened.rows:
        if steps is not None and r.step is None:
            raise shell.error_at(
                r, f"--steps {steps} needs a step on every row; this row has none", field="step"
            )
        wanted = steps is None or r.step in steps
        rows.append((f, local, r.group, response_size(r), wanted))
        if wanted:
            has_ids = has_ids and r.response_ids is not None and r.prompt_ids is not None
            tool_output = tool_output or (r.mask is not None and 0 in r.mask)
            if on_row is not None:
                on_row((f, shell, r))
    return FileScan(rows, has_ids, tool_output, shell.format, dict(shell.clamped))


def response_size(r: Response) -> int:
    """A response's size for the index (and for balancing ranks): its tokens, or the characters
    of its text when it has no ids yet."""
    return len(r.response_ids) if r.response_ids is not None else len(r.response or "")


def scan_columns(f: int, parquet: Any) -> FileScan | None:
    """The scan of file `f`, a plain Parquet file opened as `parquet`, from its columns (every
    row wanted), or None."""
    keys = set(parquet.schema_arrow.names)
    groups = [k for k in KEYS["group"] if k in keys]
    if not groups:
        return None
    others = [k for k in ("response_ids", "response", "prompt_ids", "mask") if k in keys]
    rows: list[tuple[int, int, str, int, bool]] = []
    has_ids, tool_output = True, False
    for batch in parquet.iter_batches(
        batch_size=PARQUET_BATCH_ROWS, columns=groups + others, use_threads=False
    ):
        columns = dict(zip(batch.schema.names, batch.columns, strict=True))
        spellings = zip(*(columns[k].to_pylist() for k in groups), strict=True)
        ids = [_group_id(values) for values in spellings]
        sizes = _sizes(columns, batch.num_rows)
        zero = _has_zero(columns["mask"]) if "mask" in columns else False
        if None in ids or sizes is None or zero is None:
            return None
        has_ids = has_ids and all(
            k in columns and columns[k].null_count == 0 for k in ("prompt_ids", "response_ids")
        )
        tool_output = tool_output or zero
        local = len(rows)
        rows += [
            (f, local + i, g, n, True) for i, (g, n) in enumerate(zip(ids, sizes, strict=True))
        ]
    return FileScan(rows, has_ids, tool_output, "parquet", None)


def _group_id(values: tuple[Any, ...]) -> str | None:
    """The row's group id as `RawRow.parse` reads it (the first spelling present; a string or
    an integer, as text), or None when it would not accept it."""
    value = next((v for v in values if v is not None), None)
    if isinstance(value, str) or (isinstance(value, int) and not isinstance(value, bool)):
        return str(value)
    return None


def _sizes(columns: dict[str, Any], rows: int) -> list[int] | None:
    """Per row, the length of `response_ids`, else of the `response` text; None when a row has
    neither or a column has an unexpected type."""
    import pyarrow as pa
    import pyarrow.compute as pc

    ids, text = columns.get("response_ids"), columns.get("response")
    if ids is not None and not (pa.types.is_list(ids.type) or pa.types.is_large_list(ids.type)):
        return None
    if text is not None and not (
        pa.types.is_string(text.type) or pa.types.is_large_string(text.type)
    ):
        return None
    lengths = pc.list_value_length(ids).to_pylist() if ids is not None else [None] * rows
    if None in lengths:
        chars = pc.utf8_length(text).to_pylist() if text is not None else [None] * rows
        lengths = [n if n is not None else c for n, c in zip(lengths, chars, strict=True)]
    return None if None in lengths else lengths


def _has_zero(mask: Any) -> bool | None:
    """Whether some row's mask holds a 0; None for a column that is not a list of numbers."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if not _is_list(mask.type):
        return None
    values = pc.list_flatten(mask)
    if pa.types.is_boolean(values.type):
        return bool(pc.any(pc.invert(values)).as_py())
    if not (pa.types.is_integer(values.type) or pa.types.is_floating(values.type)):
        return None
    return bool(pc.any(pc.equal(values, 0)).as_py())


def _is_list(kind: Any) -> bool:
    import pyarrow as pa

    return pa.types.is_list(kind) or pa.types.is_large_list(kind)
