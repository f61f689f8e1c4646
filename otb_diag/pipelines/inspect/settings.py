"""Every knob of `otb-diag rollouts inspect`, declared once (the command line is built from
them; no torch at import)."""

from __future__ import annotations

from dataclasses import dataclass

from otb_diag.io.load_options import LoadOptions
from otb_diag.knobs import Checked, knob
from otb_diag.pipelines.measure_knobs import REWARD_COLUMNS, STEPS


@dataclass(frozen=True)
class InspectSettings(Checked):
    """How the rollouts are read (the rows of `steps`, TRL's `reward_columns`) and how text-only
    rows are tokenized (`load`: --trust-remote-code, --chat-template; inspect loads a tokenizer,
    never a model)."""

    load: LoadOptions = LoadOptions()
    steps: str | None = knob(None, STEPS)
    reward_columns: tuple[str, ...] | None = knob(None, REWARD_COLUMNS)
