"""The result of `otb-diag report`: where the page went, the runs it read, its verdicts and
what no run measured (what `--json` prints)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from otb_diag.pipelines.results import schema


@dataclass(frozen=True)
class Verdict:
    """One finding: `topic` (a short label) and one sentence."""

    topic: str
    sentence: str


@dataclass(frozen=True)
class ReportedRun:
    command: str
    label: str
    directory: str


@dataclass(frozen=True)
class ReportResult(schema.Versioned):
    command: ClassVar[str] = "report"

    out: str  # the HTML page, resolved
    runs: list[ReportedRun]
    verdicts: list[Verdict]
    absent: list[str]

    def format(self) -> str:
        return f"wrote {self.out}"
