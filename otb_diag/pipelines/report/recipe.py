"""`otb-diag report`: one self-contained HTML page from the outputs of `energy`,
`variance-compare`, `dynamics`, `train` and `regress` (its `--junit` file, or a comparison with
a golden file made here with `regress`'s own code).

Order: the verdicts (one sentence each, with its number and interval; `verdicts`), what
is absent, the figures with captions, the tables with units and definitions
(`sections`), then provenance: record files and inputs with their SHA-256, settings,
seeds, library versions and the command that redraws each run's figures
(`provenance`). Every piece is inline (`html.py`); the file is written atomically."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from otb_diag.errors import InputError
from otb_diag.io.atomic import write_text
from otb_diag.io.provenance import file_sha256
from otb_diag.pipelines.regress import golden as regress
from otb_diag.pipelines.regress.run_metrics import (
    RECORD_FILES,
    RUN_COMMANDS,
    collect_metrics,
    find_runs,
    read_fidelity,
)
from otb_diag.pipelines.report import html, verdicts
from otb_diag.pipelines.report.provenance import command, input_files
from otb_diag.pipelines.report.sections import TABLES, Run, figures
from otb_diag.pipelines.report.settings import ReportInputs
from otb_diag.pipelines.results.report import ReportedRun, ReportResult, Verdict
from otb_diag.pipelines.results.schema import plain
from otb_diag.pipelines.shell import run_recipe

REPORT_COMMANDS = ("variance-compare", "energy", "dynamics", "train")  # the report's order
JUNIT_SUITE = "otb-diag regress"


@dataclass(frozen=True)
class Regression:
    """A regression status: from a comparison with a golden file or a regress JUnit file."""

    source: str
    counts: dict[str, int]
    failing: list[tuple[str, str]]  # (metric, status: message)


def _find_inputs(dirs: Sequence[Path]) -> tuple[list[Run], list[Regression]]:
    """Every run (any of REPORT_COMMANDS) and every regress JUnit report at or under each of
    `dirs`; a directory with neither is an input error."""
    runs: list[Run] = []
    reports: list[Regression] = []
    for root in dirs:
        if not root.exists():
            raise InputError("no such file or directory", path=root, field="RUN_DIR")
        junit = [r for p in sorted(root.rglob("*.xml")) if (r := _read_junit(p))]
        found = find_runs(root, REPORT_COMMANDS, field="RUN_DIR", required=False)
        if not found and not junit:
            files = ", ".join(sorted(set(RECORD_FILES.values())))
            raise InputError(
                "nothing to report here: expected the output directory of `otb-diag "
                f"energy`, `variance-compare`, `dynamics` or `train` ({files}), a "
                "`regress --junit` file, or a directory holding several",
                path=root,
                field="RUN_DIR",
            )
        for run_dir, command_name, result in found:
            label = (Path(root.resolve().name) / run_dir.relative_to(root)).as_posix()
            runs.append(Run(run_dir, command_name, result, label, root))
        reports += junit
    runs.sort(key=lambda r: REPORT_COMMANDS.index(r.command))
    return runs, reports


def _read_junit(path: Path) -> Regression | None:
    """The status a `regress --junit` file records; None for any other XML file."""
    try:
        root = ET.parse(path).getroot()
    except (ET.ParseError, OSError):
        return None
    suite = root.find("testsuite") if root.tag == "testsuites" else root
    if suite is None or suite.get("name") != JUNIT_SUITE:
        return None
    counts = {"pass": 0, "fail": 0, "missing": 0, "extra": 0}
    failing = []
    for case in suite.iter("testcase"):
        failure = case.find("failure")
        status = "pass" if failure is None else failure.get("message", "fail").split(":")[0]
        counts[status if status in counts else "fail"] += 1
        if failure is not None:
            failing.append((case.get("name", "?"), failure.get("message", "")))
    return Regression(f"the regress report {path}", counts, failing)


def _golden_regression(golden: Path, runs: list[Run]) -> Regression:
    """Compare the energy/variance-compare runs with `golden` exactly as `otb-diag regress`
    does (metric names relative to each RUN_DIR holding them)."""
    roots = sorted({r.root for r in runs if r.command in RUN_COMMANDS})
    if not roots:
        raise InputError(
            "--golden needs an energy or variance-compare run among the RUN_DIRs", field="--golden"
        )
    metrics = {}
    for root in roots:
        metrics.update(collect_metrics(root))
    rows = regress.compare(regress.load_golden(golden), metrics)
    failing = [(r.name, f"{r.status}: {r.message}") for r in rows if r.status != "pass"]
    return Regression(f"the golden file {golden}", regress.counts(rows), failing)


def _page(
    dirs: Sequence[Path], golden: Path | None
) -> tuple[str, list[Run], list[Verdict], list[str]]:
    """The HTML page and what it says: the runs, the verdicts, what is absent."""
    runs, regressions = _find_inputs(dirs)
    if golden is not None:
        regressions.insert(0, _golden_regression(golden, runs))
    found, absent = _verdicts(runs, regressions)
    body = [
        html.element("h2", "Verdicts"),
        html.bullet_list(
            (
                (html.element("strong", html.text(v.topic)) + ": " + html.text(v.sentence))
                for v in found
            ),
            class_="verdicts",
        ),
    ]
    if absent:
        body += [
            html.element("h3", "Absent"),
            *(html.paragraph(a, class_="absent") for a in absent),
        ]
    body += _figures(runs) + _tables(runs, regressions) + _provenance(runs, dirs, golden)
    subtitle = f"{len(runs)} run(s) from " + ", ".join(str(d) for d in dirs)
    return html.page("otb-diag report", subtitle, "\n".join(body)), runs, found, absent


def run_report(inputs: ReportInputs, out: Path) -> ReportResult | None:
    """Write the page for the runs under `inputs.run_dirs` (compared with `inputs.golden` when
    given) to the file `out`; returns the result: `out` (resolved), `runs` (command, label,
    directory), `verdicts` (topic, sentence) and `absent` (what no run measured). In the recipe
    shell, on rank 0 alone (None on the others under torchrun); the page is one file, written
    atomically, so no folder is staged."""
    return run_recipe(lambda stage: _report(inputs, out), every_rank=False, progress=False)


def _report(inputs: ReportInputs, out: Path) -> ReportResult:
    page, runs, found, absent = _page(inputs.run_dirs, inputs.golden)
    write_text(out, page)
    return ReportResult(
        out=str(out.resolve()),
        runs=[ReportedRun(r.command, r.label, str(r.directory)) for r in runs],
        verdicts=found,
        absent=absent,
    )


def _verdicts(runs: list[Run], regressions: list[Regression]) -> tuple[list[Verdict], list[str]]:
    # The budget answers lead: they answer what a user came to decide. A training run's pooled
    # split first: it rests on the run's every split step, more prompts than any offline pool.
    found: list[Verdict] = [
        v for run in runs if run.command == "dynamics"
        for v in verdicts.pooled_budget_verdicts(run.result, run.label)
    ] + [
        v for run in runs if run.command == "variance-compare"
        for v in verdicts.budget_verdict(run.result, run.label)
    ]  # fmt: skip
    absent: list[str] = []
    for run in runs:
        if run.command == "variance-compare":
            found += verdicts.variance_verdicts(run.result, run.label)
            if run.result.signal.carries_any:  # else nothing was measured: no file, no mode
                fidelity = read_fidelity(run.directory / "fidelity.csv")
                found += verdicts.fidelity_verdicts(fidelity, run.label)
                absent += verdicts.absent_modes(run.result, run.label)
        elif run.command == "energy":
            found += verdicts.energy_verdicts(run.result, run.label)
        elif run.command == "dynamics":
            found += verdicts.collapse_verdicts(run.result, run.label)
        else:
            found += verdicts.train_verdicts(run.result, run.label)
    found += [verdicts.regression_verdict(r.counts, r.source) for r in regressions]
    commands = {r.command for r in runs}
    missing = {
        "variance-compare": "no variance-compare run: no OTB mean-equivalent N′, token saving, "
        "paper-claim verdict or proxy fidelity",
        "energy": "no energy run: no realized-energy figures (3–5) or variance proxies",
        "dynamics": "no dynamics run: no collapse, warning or lead-time verdict "
        "(run otb-diag dynamics --log metrics.jsonl)",
    }
    absent += [text + "." for name, text in missing.items() if name not in commands]
    if not regressions:
        absent.append("no regression status: give --golden FILE (or a regress --junit file).")
    return found, absent


def _figures(runs: list[Run]) -> list[str]:
    parts = [html.element("h2", "Figures")]
    shown = [(run, figures(run)) for run in runs]
    for run, figs in shown:
        if figs:
            parts.append(html.element("h3", html.text(f"{run.command}: {run.label}")))
            parts += [f for _, f in figs]
    if not any(figs for _, figs in shown):
        parts.append(html.paragraph("No figure: none of the runs wrote one.", class_="absent"))
    return parts


def _tables(runs: list[Run], regressions: list[Regression]) -> list[str]:
    parts = [html.element("h2", "Tables")]
    for run in runs:
        parts += [
            html.element("h3", html.text(f"{run.command}: {run.label}")),
            TABLES[run.command](run),
        ]
    for r in regressions:
        parts.append(html.element("h3", html.text(f"regression: {r.source}")))
        if r.failing:
            shown = r.failing[:50]
            parts.append(
                html.table(
                    ["metric", "status and reason"],
                    shown,
                    caption=f"Non-passing metrics ({len(shown)} of {len(r.failing)} shown)",
                )
            )
        else:
            parts.append(html.paragraph(f"All {sum(r.counts.values())} metrics pass."))
    return parts


def _provenance(runs: list[Run], dirs: Sequence[Path], golden: Path | None) -> list[str]:
    parts = [
        html.element("h2", "Provenance"),
        html.paragraph(
            "Inputs are hashed with SHA-256 (a checkpoint directory: every file's name and "
            "content). Each run's command rewrites its directory, figures included, with the "
            "same settings and seeds."
        ),
    ]
    if golden is not None:
        parts.append(html.table(["golden file", "SHA-256"], [(str(golden), file_sha256(golden))]))
    for run in runs:
        record_file = run.directory / RECORD_FILES[run.command]
        files = [("record", str(record_file), file_sha256(record_file))]
        files += list(input_files(run.command, run.result))
        settings = _settings(run)
        made = [name for name, _ in figures(run)]
        parts += [
            html.element("h3", html.text(f"{run.command}: {run.label}")),
            html.table(["file", "path", "SHA-256"], files),
            html.paragraph(f"Seed: {settings.get('seed', 'none (no random draw)')}."),
            html.element("p", "Settings:"),
            html.code_block(json.dumps(settings, indent=1, sort_keys=True)),
            html.element(
                "p",
                "Command (redraws " + html.text(", ".join(made) if made else "no figure") + "):",
            ),
            html.code_block(command(run.command, run.result, run.directory.resolve())),
        ]
        versions = None if run.command == "dynamics" else run.result.versions
        if versions:
            parts.append(html.table(["library", "version"], sorted(versions.items())))
    return parts


def _settings(run: Run) -> dict[str, Any]:
    """The settings a run was made with, as its record file holds them: its result's, or
    dynamics' rule."""
    if run.command == "dynamics":
        return run.result.rule_json()
    return plain(run.result.settings)
