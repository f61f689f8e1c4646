"""`otb-diag regress` as one call: collect the run's metrics, then either rewrite the golden file
(`--update`) or compare with it (and write the JUnit report); the outcome says what to print and
the exit status (1 when a metric moved)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from otb_diag.pipelines.inputs import Say, silent
from otb_diag.pipelines.regress import golden as lib
from otb_diag.pipelines.regress.run_metrics import Metric, collect_metrics
from otb_diag.pipelines.regress.settings import RegressInputs, RegressSettings
from otb_diag.pipelines.shell import run_recipe

EXIT_REGRESSION = 1
NO_COMMON_NAME = (
    "no metric name in common: names carry the path below --current (energy/proxies/...), so "
    "point --current at the level the golden was made from"
)


@dataclass(frozen=True)
class RegressOutcome:
    """What a regress run found: the compared `rows` (None after `--update`, which compares
    nothing and says what it wrote in `message`) and the exit status."""

    rows: tuple[lib.Row, ...] | None
    message: str = ""

    @property
    def exit_code(self) -> int:
        failed = self.rows is not None and any(r.status != "pass" for r in self.rows)
        return EXIT_REGRESSION if failed else 0

    def format(self, *, every: bool = False) -> str:
        """The table (only the failing metrics unless `every`), or `message` after an update."""
        return self.message if self.rows is None else lib.format_rows(self.rows, every=every)

    def to_json(self) -> dict[str, Any]:
        rows = self.rows or ()
        return {"counts": lib.counts(rows), "rows": [r.to_json() for r in rows]}


def run_regress(
    inputs: RegressInputs, settings: RegressSettings = RegressSettings(), *, say: Say = silent
) -> RegressOutcome | None:
    """Compare the run under `inputs.current` with the golden file, or rewrite it
    (`settings.update`); what the user should know beside the outcome goes through `say`. In
    the recipe shell, on rank 0 alone (None on the others under torchrun): it writes no folder,
    only the golden file or the --junit report, each atomically."""
    return run_recipe(
        lambda stage: _regress(inputs, settings, stage.say),
        say=say,
        progress=False,
        every_rank=False,
    )


def _regress(inputs: RegressInputs, settings: RegressSettings, say: Say) -> RegressOutcome:
    metrics = collect_metrics(inputs.current)
    if settings.update:
        return _update(inputs, settings, metrics, say)
    rows = tuple(
        lib.compare(
            lib.load_golden(inputs.golden),
            metrics,
            lib.load_tolerances(settings.tolerances) if settings.tolerances is not None else (),
        )
    )
    if settings.junit is not None:
        lib.write_junit(settings.junit, rows)
    if rows and all(r.status in ("missing", "extra") for r in rows):
        say(NO_COMMON_NAME)
    return RegressOutcome(rows)


def _update(
    inputs: RegressInputs, settings: RegressSettings, metrics: dict[str, Metric], say: Say
) -> RegressOutcome:
    if settings.junit:
        say("--update compares nothing: no --junit report written")
    golden = inputs.golden
    old = lib.load_golden(golden) if golden.exists() else None
    lib.write_golden(golden, metrics, lib.run_provenance(inputs.current))
    if old is None:
        return RegressOutcome(None, f"created {golden} with {len(metrics)} metrics")
    changes = lib.golden_changes(old, metrics)
    lines = [lib.format_changes(changes)] if changes else []
    lines.append(f"updated {golden}: {len(metrics)} metrics, {len(changes)} changed")
    return RegressOutcome(None, "\n".join(lines))
