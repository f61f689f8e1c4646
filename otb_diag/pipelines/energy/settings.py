"""Every knob of `otb-diag energy`, declared once (the command line is built from them; no torch
at import)."""

from __future__ import annotations

from dataclasses import dataclass

from otb_diag.io.load_options import LoadOptions
from otb_diag.knobs import Checked, internal, knob, named
from otb_diag.pipelines.measure_knobs import (
    REWARD_COLUMNS,
    STEPS,
    TEMPERATURE,
    ZERO_TAIL,
    baselines_knob,
    batch_tokens_knob,
    chunk_size_knob,
)

SYMBOLS = {"eps": "ε"}  # how the help writes a baseline's option


def _trainer_help() -> str:
    from otb_diag.maths.estimators.registry import BASELINES, trainer_baseline

    verl = ", ".join(name for entry in BASELINES.values() for name in entry.verl)
    trl = trainer_baseline("trl")
    default = (
        f" Default for TRL completion logs: {trl[0]} with "
        + ", ".join(f"{SYMBOLS.get(key, key)} = {value:g}" for key, value in trl[1].items())
        + "."
        if trl
        else ""
    )
    return (
        "Audit the advantages the rollouts carry (trainer_advantage; TRL's advantage) against "
        f"this registry baseline, or verl's algorithm.adv_estimator name ({verl}).{default}"
    )


@dataclass(frozen=True)
class EnergySettings(Checked):
    """Every knob of `otb-diag energy` (the CLI's options, with the same defaults)."""

    baselines: tuple[str, ...] = baselines_knob(", e.g. none,mean,otb,otb-loo")
    temperature: float | None = knob(None, TEMPERATURE)  # overrides the rollouts' own τ
    batch_tokens: int | None = batch_tokens_knob()  # None: auto (`measure_knobs.planned`)
    chunk_size: int | None = chunk_size_knob()
    group: str | None = knob(
        None, named, help="Group shown in fig3/fig4. Default: most heterogeneous."
    )
    handle_zero_tail: bool = knob(True, ZERO_TAIL)
    tir: bool | None = internal(None)  # None: on when any response holds tool output (mask 0)
    load: LoadOptions = LoadOptions()
    steps: str | None = knob(None, STEPS)
    reward_columns: tuple[str, ...] | None = knob(None, REWARD_COLUMNS)
    trainer_baseline: str | None = knob(None, metavar="NAME", help=_trainer_help)

    def check(self) -> None:
        """Raise `InputError` now, before anything is read or written, for a device this machine
        lacks or a baseline the registry does not know (the CLI and the API get the same error;
        here, not when the object is built: a record read back need not know a name registered
        at run time, nor a device of the machine that wrote it)."""
        from otb_diag.maths.estimators.registry import get_baseline, resolve_name

        self.load.check()  # a device this machine lacks
        for name in self.baselines:
            get_baseline(name)  # lists the known ones
        if self.trainer_baseline is not None:
            resolve_name(self.trainer_baseline)  # a registry or verl adv_estimator name
