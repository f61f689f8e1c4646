"""`otb-diag energy`: per-token statistics, realized energy, baselines and figures 3–5."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from otb_diag.cli.common import note, show
from otb_diag.cli.options import OUT_DIR, Measuring, command

from otb_diag.knobs import knob
from otb_diag.pipelines.energy.settings import EnergySettings
from otb_diag.pipelines.inputs import EnergyInputs


@dataclass(frozen=True)
class EnergyRun(Measuring):
    inputs: EnergyInputs = EnergyInputs()  # --ckpt, --rollouts, --scenario, --model-free
    out: Path = knob(Path("otb-energy"), OUT_DIR)


@command
def energy(run: EnergyRun, settings: EnergySettings) -> None:
    """Realized energy of every response token: log-prob, Σπ², entropy, the logit-gradient
    proxy w = 1 − 2p + Σπ² (÷τ²) and its running sum W_t; the advantages each baseline gives;
    the forward-only variance proxies; and figures 3–5 of the OTB paper.

    Writes into --out: tokens.parquet, sequences.csv, groups.csv, proxies.json, summary.json and
    the figures {figures} as PNG and PDF (fig_energy_by_step: with several checkpoints). When
    the rollouts carry the trainer's advantages, they are audited against its estimator.

    Example: otb-diag energy --ckpt ./checkpoint-200 --rollouts rollouts.jsonl --out energy/
    """
    from otb_diag.pipelines.energy.recipe import run_energy

    result = run_energy(
        run.inputs,
        run.out,
        settings,
        progress=not run.quiet,
        say=note,
    )
    show(result, run.as_json)
