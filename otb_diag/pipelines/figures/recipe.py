"""`otb-diag figures`: the whole paper-style figure set from an embedded scenario, in one run.

It runs, with fixed seeds, exactly the public commands' library entry points: `energy`
(figures 3–5 and the energy across checkpoints), `variance-compare` (variance against N, ratio
to the mean baseline, proxy fidelity), toy trainings and `dynamics` on their logs (figures 1–2,
score against tokens sampled). Working directories go under `out/runs/`; the figures are copied
to `out/` (PNG and PDF).

- `default`: trainings `mean` at N = 4 and N = 16, `otb` and `optseq` at N = 4, same seed.
- `long`: variance-compare at N = 2…64; a learning-rate sweep of `mean` at N = 4, whose lowest
  unstable rate (`dynamics/lr_sweep.py`) then trains `otb` and `optseq` at N = 4 too, and dynamics
  on the three runs at that rate (and, as `lr_sweep_*`, on the sweep).
"""

from __future__ import annotations

import shutil
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from otb_diag.dynamics.lr_sweep import choose_lr, stability
from otb_diag.io.scenarios import check_scenario, default_checkpoints
from otb_diag.io.scenarios import default_rollouts as scenario_rollouts
from otb_diag.io.training_logs import read_training_log
from otb_diag.maths.estimators.registry import baseline_names
from otb_diag.pipelines.energy.recipe import run_energy
from otb_diag.pipelines.figures.settings import FiguresSettings
from otb_diag.pipelines.figures.training_pool import TrainingJob, run_trainings
from otb_diag.pipelines.inputs import EnergyInputs, Inputs
from otb_diag.pipelines.results.figures import CollapseSteps, FiguresResult, Sweep, SweepRun
from otb_diag.pipelines.results.variance import VarianceResult
from otb_diag.pipelines.rl_training import scenario_settings
from otb_diag.pipelines.shell import run_recipe
from otb_diag.pipelines.training_logs.recipe import run_dynamics
from otb_diag.pipelines.training_logs.settings import TrainingLogs
from otb_diag.pipelines.variance.recipe import VarianceSettings, run_variance
from otb_diag.plots.registry import figures_of


def _kept(command: str, mode: str | None = None, sweep: bool = False) -> list[str]:
    """The file stems of `command`'s figures that the figure set keeps (the per-mode ones in
    `mode`; `sweep`: those kept from the learning-rate sweep), in the registry's order."""
    return [
        entry.file_stem(mode)
        for entry in figures_of(command)
        if (entry.in_sweep if sweep else entry.in_set) and (not entry.modes or mode in entry.modes)
    ]


@dataclass(frozen=True)
class FigurePlan:
    """How much work each part does: the full set, or `quick` (for CI, a few minutes)."""

    train_steps: int
    variance_modes: tuple[str, ...]
    draws: int
    bootstrap: int
    sketch_dim: int
    group_sizes: tuple[int, ...] = (2, 4, 8, 16)
    trainings: tuple[tuple[str, int], ...] = (("mean", 4), ("mean", 16), ("otb", 4), ("optseq", 4))
    sweep_lrs: tuple[float, ...] = ()  # long: mean N=4 at each rate, then otb/optseq at one
    prompts_per_step: int = 8
    lr: float = 1e-4  # the trainings' rate when there is no sweep

    @classmethod
    def make(cls, quick: bool, scenario: str = "default") -> FigurePlan:
        if scenario == "long":
            if quick:
                return cls(
                    train_steps=3, variance_modes=("head",), draws=20, bootstrap=100,
                    sketch_dim=16, group_sizes=(2, 4), sweep_lrs=(1e-4, 1e-3),
                    prompts_per_step=2,
                )  # fmt: skip
            # Sized for 2 CPU cores (about an hour with --jobs 2): a training step samples up
            # to 400 tokens per response, and full mode costs ~3 forward passes per direction.
            return cls(
                train_steps=200, variance_modes=("proxy", "head", "full"), draws=200,
                bootstrap=1000, sketch_dim=16, group_sizes=(2, 4, 8, 16, 32, 64),
                sweep_lrs=(3e-5, 1e-4, 3e-4, 1e-3, 3e-3), prompts_per_step=2,
            )  # fmt: skip
        if quick:
            return cls(
                train_steps=4, variance_modes=("head",), draws=40, bootstrap=200, sketch_dim=64
            )
        return cls(
            train_steps=30,
            variance_modes=("proxy", "head", "full"),
            draws=200,
            bootstrap=1000,
            sketch_dim=256,
        )


def run_figures(
    inputs: Inputs,
    out: Path,
    settings: FiguresSettings = FiguresSettings(),
    *,
    progress: bool = True,
) -> FiguresResult | None:
    """Regenerate every figure of the scenario of `inputs` (its own checkpoints and rollouts:
    another --ckpt or --rollouts is refused) into `out`; returns (and writes as
    `figures.json`) the result: what made each file. `settings.jobs` trainings run at once.
    In the recipe shell, unstaged: it runs the other commands into `out/runs`, each staged in
    its own shell, and copies their figures out as they are made."""
    inputs.refuse(("ckpt", "rollouts"), "figures runs on the scenario's own")
    plan = FigurePlan.make(settings.quick, check_scenario(inputs.scenario))
    return run_recipe(
        lambda stage: _figures(plan, inputs.scenario, out, settings, stage.progress),
        out=out,
        record="figures.json",
        progress=progress,
        staged=False,
    )


def _figures(
    plan: FigurePlan, scenario: str, out: Path, settings: FiguresSettings, progress: bool
) -> FiguresResult:
    quick, seed = settings.quick, settings.seed
    rollouts = scenario_rollouts(scenario)
    checkpoints = default_checkpoints(scenario)
    start = checkpoints[-1]  # the one the rollouts were sampled from; trainings start there
    runs = out / "runs"
    kept = _Kept(out, "" if scenario == "default" else f" --scenario {scenario}")
    timings: dict[str, float] = {}

    t0 = time.perf_counter()
    run_energy(
        EnergyInputs(ckpt=checkpoints, rollouts=rollouts), runs / "energy", progress=progress
    )
    kept.keep(
        runs / "energy",
        _kept("energy"),
        f"otb-diag energy --ckpt {_shown(start.parent)}{kept.flag}",
    )
    timings["energy_s"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    variance = _variance(plan, start, rollouts, runs / "variance", seed, kept, progress)
    timings["variance_s"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    compared, sweep = _trainings(plan, start, runs, scenario, settings, kept, progress)
    timings["train_s"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    report = run_dynamics(_logs(compared), runs / "dynamics")
    kept.keep(
        runs / "dynamics",
        _kept("dynamics"),
        f"{_train_flags(plan, seed, kept.flag)} ({', '.join(j.label for j in compared)}), then "
        "otb-diag dynamics",
    )
    timings["dynamics_s"] = time.perf_counter() - t0

    return FiguresResult(
        scenario=scenario,
        quick=quick,
        seed=seed,
        figures=kept.made,
        timings=timings,
        paper_claim=variance.paper_claim if variance else None,
        noise_scale=variance.noise_scale if variance else None,
        sweep=sweep,
        collapse=[
            CollapseSteps(r.run, r.collapse_step, r.warning_step, r.lead_steps) for r in report.runs
        ],
    )


@dataclass
class _Kept:
    """The figures copied from the runs into `out`, each with the command that made it (the
    scenario's `flag`, ` --scenario NAME` or nothing, for the commands to name)."""

    out: Path
    flag: str
    made: dict[str, str] = field(default_factory=dict)

    def keep(self, run_dir: Path, names: list[str], command: str, prefix: str = "") -> None:
        for name in names:
            for ext in ("png", "pdf"):
                shutil.copyfile(run_dir / f"{name}.{ext}", self.out / f"{prefix}{name}.{ext}")
            self.made[f"{prefix}{name}.png"] = command


def _variance(
    plan: FigurePlan,
    start: Path,
    rollouts: Path,
    run_dir: Path,
    seed: int,
    kept: _Kept,
    progress: bool,
) -> VarianceResult | None:
    """variance-compare over every registered baseline (leave-one-out variants too)."""
    settings = VarianceSettings(
        modes=plan.variance_modes,
        baselines=baseline_names(),
        draws=plan.draws,
        bootstrap=plan.bootstrap,
        sketch_dim=plan.sketch_dim,
        group_sizes=plan.group_sizes,
        seed=seed,
    )
    given = Inputs(ckpt=[start], rollouts=rollouts)
    variance = run_variance(given, run_dir, settings, progress=progress)
    kept.keep(
        run_dir,
        _kept("variance-compare", plan.variance_modes[-1]),
        f"otb-diag variance-compare{kept.flag} --mode {','.join(plan.variance_modes)} "
        f"--baselines {','.join(settings.baselines)} "
        f"--group-sizes {','.join(map(str, plan.group_sizes))} "
        f"--draws {plan.draws} --sketch-dim {plan.sketch_dim}",
    )
    return variance


def _train_flags(plan: FigurePlan, seed: int, scenario_flag: str) -> str:
    return (
        f"otb-diag train{scenario_flag} --updates {plan.train_steps} "
        f"--prompts-per-step {plan.prompts_per_step} --seed {seed}"
    )


def _trainings(
    plan: FigurePlan,
    start: Path,
    runs: Path,
    scenario: str,
    settings: FiguresSettings,
    kept: _Kept,
    progress: bool,
) -> tuple[list[TrainingJob], Sweep | None]:
    """The trainings the dynamics figures compare (after the learning-rate sweep, when the
    plan has one: its figures kept, the chosen rate used); returns them and the sweep."""

    def job(baseline: str, n: int, lr: float) -> TrainingJob:
        label = f"{baseline} N={n}" + (f" lr={lr:g}" if plan.sweep_lrs else "")
        name = f"train-{baseline}-n{n}" + (f"-lr{lr:g}" if plan.sweep_lrs else "")
        return TrainingJob(
            start,
            runs / name,
            scenario_settings(
                scenario,
                baseline=baseline,
                group_size=n,
                steps=plan.train_steps,
                seed=settings.seed,
                save_every=0,
                lr=lr,
                prompts_per_step=plan.prompts_per_step,
            ),  # fmt: skip
            label,
        )

    if not plan.sweep_lrs:
        compared = [job(b, n, plan.lr) for b, n in plan.trainings]
        run_trainings(compared, settings.jobs, progress)
        return compared, None
    sweep_jobs = [job("mean", 4, lr) for lr in plan.sweep_lrs]
    run_trainings(sweep_jobs, settings.jobs, progress)
    sweep = _sweep_verdicts(sweep_jobs, runs / "sweep-dynamics")
    kept.keep(
        runs / "sweep-dynamics",
        _kept("dynamics", sweep=True),
        f"{_train_flags(plan, settings.seed, kept.flag)} --baseline mean --group-size 4 at --lr "
        f"{', '.join(f'{lr:g}' for lr in plan.sweep_lrs)}, then otb-diag dynamics",
        prefix="lr_sweep_",
    )
    lr = sweep.chosen_lr
    compared = [sweep_jobs[plan.sweep_lrs.index(lr)], job("otb", 4, lr), job("optseq", 4, lr)]
    run_trainings(compared[1:], settings.jobs, progress)
    return compared, sweep


def _logs(jobs: list[TrainingJob]) -> TrainingLogs:
    """The trainings' logs for `dynamics`, each labelled as its job."""
    return TrainingLogs([j.out / "metrics.jsonl" for j in jobs], [j.label for j in jobs])


def _shown(path: Path) -> str:
    """`path` relative to the working directory when inside it (as a user types it; the
    record then holds no machine's absolute path), else as it is."""
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


def _sweep_verdicts(sweep_jobs: list[TrainingJob], out: Path) -> Sweep:
    """Dynamics on the sweep's runs, each run's stability and the chosen rate."""
    report = run_dynamics(_logs(sweep_jobs), out)
    verdicts = []
    for j, run in zip(sweep_jobs, report.runs, strict=True):
        scores = read_training_log(j.out / "metrics.jsonl").frame["score"].to_numpy(dtype=float)
        verdicts.append(stability(j.settings.lr, scores, run.collapse_step))
    lr, reason = choose_lr(verdicts)
    return Sweep(lr, reason, [SweepRun(**asdict(v), unstable=v.unstable) for v in verdicts])
