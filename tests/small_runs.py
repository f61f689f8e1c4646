"""Small real runs of the embedded default that several test modules share (through the
session fixtures of conftest.py): the first 4 groups x 12 responses of the embedded rollouts
under the embedded final checkpoint, measured by the real commands with reduced settings. Also
the library entry points as the tests call them (`energy`, `dynamics`, `figures`, `report`):
one place to follow their signatures."""

import json
from pathlib import Path

from otb_diag.cli.main import app
from typer.testing import CliRunner

from otb_diag.io.scenarios import DEFAULT_ROLLOUTS, default_checkpoint
from otb_diag.pipelines.energy import recipe as energy_recipe
from otb_diag.pipelines.energy.settings import EnergySettings
from otb_diag.pipelines.figures.recipe import run_figures
from otb_diag.pipelines.figures.settings import FiguresSettings
from otb_diag.pipelines.inputs import EnergyInputs, Inputs
from otb_diag.pipelines.report.recipe import run_report
from otb_diag.pipelines.report.settings import ReportInputs
from otb_diag.pipelines.results.dynamics import DynamicsResult
from otb_diag.pipelines.results.energy import EnergyResult
from otb_diag.pipelines.results.figures import FiguresResult
from otb_diag.pipelines.results.report import ReportResult
from otb_diag.pipelines.training_logs.recipe import run_dynamics
from otb_diag.pipelines.training_logs.settings import DynamicsSettings, TrainingLogs

runner = CliRunner()

# A reduced default keeps the suite fast: 4 prompts x 12 responses of the embedded rollouts.
REDUCED_GROUPS, REDUCED_RESPONSES = 4, 12
VARIANCE_ARGS = [
    *("--mode", "proxy,full", "--group-sizes", "2,4", "--draws", "40"),
    *("--bootstrap", "200", "--sketch-dim", "32"),
]


def invoke(*args: str | Path) -> tuple[int, str]:
    result = runner.invoke(app, [str(a) for a in args])
    if result.exception and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result.exit_code, result.stdout


def reduce_rollouts(
    path: Path,
    source: Path = DEFAULT_ROLLOUTS,
    groups: int = REDUCED_GROUPS,
    responses: int = REDUCED_RESPONSES,
) -> Path:
    """The first `responses` of the first `groups` groups of `source`, as the original lines
    (same bytes, so each row's content is the source's)."""
    kept: dict[str, list[str]] = {}
    for line in source.read_text(encoding="utf-8").splitlines(keepends=True):
        group = json.loads(line)["group"]
        if group not in kept and len(kept) == groups:
            continue
        members = kept.setdefault(group, [])
        if len(members) < responses:
            members.append(line)
    path.write_text("".join(line for lines in kept.values() for line in lines), encoding="utf-8")
    return path


def run_energy(rollouts: Path, out: Path) -> None:
    code, output = invoke(
        "energy", "--ckpt", default_checkpoint(), "--rollouts", rollouts, "--out", out, "--quiet"
    )
    assert code == 0, output


def run_variance(rollouts: Path, out: Path, seed: int = 0, args: list[str] = VARIANCE_ARGS) -> None:
    code, output = invoke(
        "variance-compare",
        *("--ckpt", default_checkpoint(), "--rollouts", rollouts, "--out", out),
        *("--seed", str(seed), "--quiet", *args),
    )
    assert code == 0, output


def figures(out: Path, scenario: str = "default", **settings: object) -> FiguresResult:
    """`run_figures` of `scenario` with `FiguresSettings(**settings)`, without progress bars."""
    return run_figures(Inputs(scenario=scenario), out, FiguresSettings(**settings), progress=False)


def energy(
    rollouts: Path,
    out: Path,
    ckpt: Path | None = None,
    model_free: bool = False,
    **settings: object,
) -> EnergyResult | None:
    """`run_energy` of `rollouts` under `ckpt` (or `model_free`) with `EnergySettings(**settings)`,
    without progress bars."""
    given = EnergyInputs(
        ckpt=None if ckpt is None else [ckpt], rollouts=rollouts, model_free=model_free
    )
    measured = EnergySettings(**settings)
    return energy_recipe.run_energy(given, out, measured, progress=False)


def report(dirs: list[Path], out: Path, golden: Path | None = None) -> ReportResult:
    """The report page of the runs under `dirs` written to `out` (`otb-diag report`)."""
    return run_report(ReportInputs(dirs, golden), out)


def dynamics(
    logs: list[Path], out: Path, labels: list[str] | None = None, target: float | None = None
) -> DynamicsResult:
    """`otb-diag dynamics` of `logs` (labelled `labels`) under the default detection rule."""
    result = run_dynamics(TrainingLogs(logs, labels), out, DynamicsSettings(target=target))
    assert result is not None  # one process: rank 0
    return result
