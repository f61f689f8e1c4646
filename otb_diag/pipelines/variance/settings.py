"""Every knob of `otb-diag variance-compare`, declared once (the command line is built from
them). Defaults that a registry or the maths supply are read when a settings object is made, so
this module imports no torch."""

from __future__ import annotations

from dataclasses import dataclass

from otb_diag.errors import InputError
from otb_diag.io.load_options import LoadOptions
from otb_diag.knobs import comma_ints, comma_list, internal, joined, knob
from otb_diag.pipelines.measure_knobs import (
    REWARD_COLUMNS,
    STEPS,
    TEMPERATURE,
    ZERO_TAIL,
    aggregation_names,
    baselines_knob,
    batch_tokens_knob,
    chunk_size_knob,
)


def _default_aggregations() -> tuple[str, ...]:
    from otb_diag.maths.variance.paired_draws import DEFAULT_AGGREGATIONS

    return DEFAULT_AGGREGATIONS


def _default_group_sizes() -> tuple[int, ...]:
    from otb_diag.maths.variance.paired_draws import DEFAULT_GROUP_SIZES

    return DEFAULT_GROUP_SIZES


def _default_budget() -> float:
    from otb_diag.policy.scores.cost import DEFAULT_BUDGET_S

    return DEFAULT_BUDGET_S


MODES = ("proxy", "head", "full")
ENGINES = ("auto", "jvp", "vjp")
_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0}


def seconds(text: str) -> float:
    """`90`, `90s`, `30m`, `2h` -> seconds (whether positive, `VarianceSettings.check` says)."""
    value, unit = (text[:-1], text[-1]) if text[-1:] in _UNITS else (text, "s")
    try:
        return float(value) * _UNITS[unit]
    except ValueError:
        raise InputError(
            f"budget must look like 90s, 30m or 2h, got '{text}'", field="budget"
        ) from None


def duration(value: float) -> str:
    """The inverse of `seconds`: 7200 -> `2h`, 90 -> `90s`."""
    for unit in ("h", "m"):
        if value % _UNITS[unit] == 0:
            return f"{value / _UNITS[unit]:.15g}{unit}"
    return f"{value:.15g}s"


@dataclass(frozen=True)
class VarianceSettings:
    """Every knob of `otb-diag variance-compare` (the CLI's options, same defaults)."""

    modes: tuple[str, ...] = knob(
        ("proxy", "head"),
        flag="--mode",
        cli=str,
        parse=comma_list,
        show=joined,
        help="Comma-separated: proxy (forward only; synthetic scores with ‖s_t‖² = w_t), head "
        "(exact output-layer gradients, Kronecker-sketched), full (exact gradients of all "
        "parameters, JL-projected by forward- or reverse-mode autodiff; its cost estimate is "
        "printed first).",
    )
    baselines: tuple[str, ...] = baselines_knob("; must include none and mean")
    aggregations: tuple[str, ...] = knob(
        factory=_default_aggregations,
        cli=str,
        parse=comma_list,
        show=joined,
        help=lambda: f"Comma-separated, of: {', '.join(aggregation_names())}.",
    )
    group_sizes: tuple[int, ...] = knob(
        factory=_default_group_sizes,
        cli=str,
        parse=lambda text: comma_ints(text, "group sizes", "group-sizes"),
        show=joined,
        help="Group sizes N; those above M/2 (M: the smallest pool) are left out, so the default "
        "measures 2-16 on pools of 32 and 2-64 on pools of 128.",
    )
    draws: int = knob(200, help="Groups drawn per prompt and N.")
    bootstrap: int = knob(1000, help="Bootstrap resamples.")
    sketch_dim: int = knob(256, help="Dimension k of the projected score vectors.")
    seed: int = knob(0, help="Seed of draws and projections.")
    force: bool = knob(False, help="Run full mode even when its estimate exceeds --budget.")
    temperature: float | None = knob(None, TEMPERATURE)
    steps: str | None = knob(None, STEPS)
    reward_columns: tuple[str, ...] | None = knob(None, REWARD_COLUMNS)
    batch_tokens: int | None = batch_tokens_knob()  # None: auto (`measure_knobs.planned`)
    chunk_size: int | None = chunk_size_knob()
    handle_zero_tail: bool = knob(True, ZERO_TAIL)
    zero_tail_split: bool = knob(
        False,
        help="Also measure OTB without verl's zero tail on the same draws (row "
        "otb-no-zero-tail; real gradients in head and full mode) and test whether the tail's "
        "part of the gradient has mean zero (zero_tail.csv).",
    )
    tir: bool | None = internal(None)  # None: on when any response holds tool output (mask 0)
    load: LoadOptions = LoadOptions()
    engine: str = knob(
        "auto",
        help="Full mode: jvp (forward mode, k passes for all tokens at once; per-token norms "
        "estimated), vjp (reverse mode, one backward per token; exact norms) or auto (the cost "
        "model's choice).",
    )
    params: str | None = knob(
        None,
        metavar="REGEX",
        help="Full mode: project only the parameters whose name matches (e.g. 'lm_head', "
        "'layers\\.(2[0-9])\\.', 'lora_').",
    )
    by_block: bool = knob(
        False,
        help="Full mode: directions per parameter block (embeddings, each layer, final norm, "
        "head); writes variance_blocks.csv and per-block fidelity.",
    )
    directions_per_block: int | None = knob(
        None,
        help="With --by-block: directions per block (default ⌈sketch-dim / blocks⌉). Forward "
        "mode costs one pass per direction and block.",
    )
    budget_s: float | None = knob(
        factory=_default_budget,
        flag="--budget",
        cli=str,
        parse=seconds,
        show=duration,
        help="Full mode refuses runs estimated longer than this (e.g. 90s, 30m, 2h) unless "
        "--force.",
    )
    prompts_per_step: int | None = knob(
        None,
        min=1,
        help="The batch of prompts your trainer takes a step on: the SNR |G|²/(tr Σ/P) is given "
        "there. Default: the prompts of the rollouts.",
    )
    current_n: int = knob(
        8,
        min=1,
        help="The responses per prompt you train with (verl rollout.n, TRL num_generations): "
        "the recommendation compares against mean at this N.",
    )

    def check(self) -> None:
        """Raise `InputError` now, before anything is read or written, for a mode, engine or
        budget the run could not honour (the CLI and the API get the same error)."""
        unknown = [m for m in self.modes if m not in MODES]
        if unknown or not self.modes:
            raise InputError(
                f"unknown mode(s) {unknown}; choose from {', '.join(MODES)}", field="mode"
            )
        if self.engine not in ENGINES:
            raise InputError(
                f"unknown engine '{self.engine}'; choose {', '.join(ENGINES)}", field="engine"
            )
        if self.budget_s is not None and not self.budget_s > 0:
            raise InputError(f"budget must be positive, got {self.budget_s} s", field="budget")
        from otb_diag.maths.estimators.registry import get_baseline

        for name in self.baselines:
            get_baseline(name)  # an unknown name stops here, listing the known ones
        if self.zero_tail_split and ("otb" not in self.baselines or not self.handle_zero_tail):
            raise InputError(
                "--zero-tail-split compares OTB with and without verl's zero tail: it needs otb "
                "among the baselines and the zero tail on.",
                field="zero-tail-split",
            )
