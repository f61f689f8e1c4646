"""`otb-diag regress`: fail CI when the numbers of an energy/variance-compare run move."""

from __future__ import annotations

from dataclasses import dataclass

import typer
from otb_diag.cli.common import note, show
from otb_diag.cli.options import JSON, command

from otb_diag.knobs import Checked, knob
from otb_diag.pipelines.regress.settings import RegressInputs, RegressSettings


@dataclass(frozen=True)
class RegressRun(Checked):
    as_json: bool = knob(False, JSON)
    every: bool = knob(False, flag="--all", help="Print every metric, not only the failing ones.")


@command
def regress(inputs: RegressInputs, settings: RegressSettings, run: RegressRun) -> None:
    """Compare a run's variance numbers with a golden file and exit 1 if any moved.

    Deterministic metrics (energies, variance proxies, advantage statistics, sequence energy,
    proxy fidelity) must agree within a relative/absolute tolerance; statistical ones from
    variance.csv (variance, ratio to mean, equivalent N, token savings, bias z) pass when the
    golden and current 95 % intervals overlap, so a reseeded run does not fail for noise.
    A metric missing from the run or absent from the golden file also fails.
    Exit status: 0 all pass (or --update), 1 regression, 2 bad input.

    Example:

        otb-diag energy --rollouts r.jsonl --out runs/energy

        otb-diag variance-compare --rollouts r.jsonl --out runs/variance

        otb-diag regress --golden golden.json --current runs --update   # once, then commit

        otb-diag regress --golden golden.json --current runs --junit report.xml
    """
    from otb_diag.pipelines.regress.recipe import run_regress

    outcome = run_regress(inputs, settings, say=note)
    if outcome is None:  # a rank other than 0 under torchrun: rank 0 prints
        return
    as_json = run.as_json and outcome.rows is not None  # --update prints what it wrote
    show(outcome, as_json, every=run.every)
    if outcome.exit_code:
        raise typer.Exit(outcome.exit_code)
