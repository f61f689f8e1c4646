"""A run directory's summary.json back as its command's result: the one reader that `report`,
`figures`, `regress` and the CLI share."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from otb_diag.errors import InputError
from otb_diag.pipelines.results.dynamics import DynamicsResult
from otb_diag.pipelines.results.energy import EnergyResult
from otb_diag.pipelines.results.train import TrainResult
from otb_diag.pipelines.results.variance import VarianceResult

Result = EnergyResult | VarianceResult | TrainResult | DynamicsResult
# The commands whose record file (summary.json, train.json, collapse.json) reads back into
# its result class.
RESULTS: dict[str, type[Result]] = {
    cls.command: cls for cls in (EnergyResult, VarianceResult, TrainResult, DynamicsResult)
}


def result_from_json(data: Any, path: Path) -> Result | None:
    """The result a record file's parsed `data` (read from `path`) holds; None when it is not
    the record of a command with a result class (another tool's file of the same name)."""
    cls = RESULTS.get(data.get("command")) if isinstance(data, dict) else None
    return None if cls is None else cls.from_json(data, path)


def read_record(path: Path) -> Any:
    """A record file's parsed JSON; an unreadable file is an `InputError` naming it."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise InputError(f"cannot read the run record: {err}", path=path) from None
