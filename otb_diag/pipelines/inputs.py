"""The checkpoints and rollouts a command was given, or the embedded scenario's in their place
(said through `say`, so the user knows which files were measured).

Every command's entry point takes what the command line gave, unresolved (`Inputs`: the raw
--ckpt, --rollouts and --scenario), and resolves it here itself; so `cli/` only parses, calls
the entry point and prints, and the Python API gets the same defaults and notes."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from otb_diag.errors import InputError
from otb_diag.io.model_size import largest_model
from otb_diag.io.scenarios import default_checkpoint, default_rollouts, scenario_knob
from otb_diag.knobs import Checked, Knob, knob
from otb_diag.runtime.threads import NO_MODEL

Say = Callable[[str], None]

# The options naming a command's files, declared once for every command that takes them.
CKPT = Knob(
    flag="--ckpt",
    metavar="DIR",
    help="Checkpoint directory (HF causal LM) or .gguf file (needs otb-diag[gguf]), repeatable "
    "where a command measures several; or a run directory holding checkpoint-* (HF Trainer/TRL) "
    "or global_step_* (verl) checkpoints. Default: the embedded final checkpoint.",
)
ROLLOUTS = Knob(
    metavar="PATH",
    help="Rollouts: a file (JSONL/Parquet, verl dump, TRL completion log), a directory (verl's "
    "rollout_data_dir, a TRL output_dir; every *.jsonl/*.parquet in step order) or a quoted "
    "glob. Default: embedded.",
)


def silent(message: str) -> None:
    """The `say` of a caller that wants no notes (the Python API's default)."""


@dataclass(frozen=True)
class Inputs(Checked):
    """The files a command measuring rollouts under checkpoints was given, as given: --ckpt
    (none, one or several; run directories allowed), --rollouts, and the --scenario whose
    embedded files stand in for an omitted one."""

    ckpt: list[Path] | None = knob(None, CKPT)
    rollouts: Path | None = knob(None, ROLLOUTS)
    scenario: str = scenario_knob()

    def rollouts_path(self, say: Say) -> Path:
        return rollouts_or_default(self.rollouts, self.scenario, say)

    def checkpoint_dirs(self, say: Say) -> list[Path]:
        return checkpoint_dirs(self.ckpt, self.scenario, say)

    def parameters(self) -> int | None:
        """The parameters of the largest model the command runs, the scenario's when no --ckpt
        is given: what sets its threads (`otb_diag/runtime/threads.py:choose_threads`)."""
        return largest_model(self.ckpt or [_scenario_checkpoint(self.scenario)])

    def refuse(self, names: tuple[str, ...], why: str) -> None:
        """An `InputError` for the first of `names` (`ckpt`, `rollouts`) that was given to a
        command that takes none, saying `why`."""
        for name in names:
            if getattr(self, name):
                raise InputError(f"--{name} given, but {why}: give none", field=f"--{name}")


@dataclass(frozen=True)
class EnergyInputs(Inputs):
    """What `energy` reads: `Inputs`, or with `model_free` no checkpoint at all (the rollouts'
    own logprobs and sum_pi2 stand in for the model's)."""

    model_free: bool = knob(
        False, help="No checkpoint: use the rollouts' logprobs and sum_pi2 (entropy unavailable)."
    )

    def parameters(self) -> int | None:
        return NO_MODEL if self.model_free else super().parameters()


@dataclass(frozen=True)
class LabInputs(Checked):
    """What `lab build` builds from: the embedded --scenario (its task, model and SFT run)."""

    scenario: str = scenario_knob()


@dataclass(frozen=True)
class SampleInputs:
    """The files `rollouts sample` was given: the prompts, and the checkpoint to sample from
    (--ckpt: one path, or the command line's list, holding at most one; the embedded default
    checkpoint when none)."""

    prompts: Path
    ckpt: Path | list[Path] | None = None

    def checkpoint(self, say: Say) -> Path:
        one = one_checkpoint(self.ckpt, "sample draws from one policy")
        return checkpoint_or_default(one, "default", say)

    def parameters(self) -> int | None:
        """As `Inputs.parameters`, of the one checkpoint sampled from."""
        given = [self.ckpt] if isinstance(self.ckpt, Path) else self.ckpt
        return largest_model(given or [_scenario_checkpoint("default")])


def _scenario_checkpoint(scenario: str) -> Path | None:
    """The scenario's final checkpoint, None where it is not shipped (the entry point, looking
    it up again, says so)."""
    try:
        return default_checkpoint(scenario)
    except (InputError, OSError):
        return None


def _or_default(value: Path | None, default: Callable[[], Path], what: str, say: Say) -> Path:
    """`value`, or the embedded default with a note saying it was used (`what`: the option
    omitted; every command says it in these words). `default` is called only then: finding a
    scenario's files fails when it is not shipped, which must not matter to a user who named
    their own."""
    if value is not None:
        return value
    path = default()
    say(f"no {what} given: using the embedded default {path}")
    return path


def rollouts_or_default(rollouts: Path | None, scenario: str, say: Say) -> Path:
    return _or_default(rollouts, lambda: default_rollouts(scenario), "--rollouts", say)


def checkpoint_or_default(ckpt: Path | None, scenario: str, say: Say) -> Path:
    return _or_default(ckpt, lambda: default_checkpoint(scenario), "--ckpt", say)


def checkpoint_dirs(ckpt: list[Path] | None, scenario: str, say: Say) -> list[Path]:
    """Every checkpoint the --ckpt options name (run directories expanded, oldest first), or
    the scenario's embedded final checkpoint, with a note, when none is given."""
    from otb_diag.io.checkpoint import find_checkpoints  # torch: not when only parsing

    dirs = ckpt or [checkpoint_or_default(None, scenario, say)]
    return [c for d in dirs for c in find_checkpoints(d)]


def one_checkpoint(ckpt: Path | list[Path] | None, why: str) -> Path | None:
    """The single --ckpt a command that uses one checkpoint was given (None when omitted; the
    Python API may pass the path itself); more than one is an `InputError` that says why only
    one is meaningful."""
    if isinstance(ckpt, Path):
        return ckpt
    if ckpt and len(ckpt) > 1:
        names = ", ".join(str(c) for c in ckpt)
        raise InputError(
            f"{len(ckpt)} --ckpt given ({names}), but {why}: give one --ckpt", field="--ckpt"
        )
    return ckpt[0] if ckpt else None


def one_rollouts(positional: Path | None, option: Path | None) -> Path | None:
    """The rollouts named either positionally or by --rollouts (an alias); both, naming
    different paths, is an `InputError`."""
    if positional is not None and option is not None and positional != option:
        raise InputError(
            f"rollouts given twice, as {positional} and as --rollouts {option}: give one",
            field="--rollouts",
        )
    return option if option is not None else positional
