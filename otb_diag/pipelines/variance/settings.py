"""Every knob of `otb-diag variance-compare`, declared once (the command line is built from
them). Defaults that a registry or the maths supply are read when a settings object is made, so
this module imports no torch."""

from __future__ import annotations

import re
from dataclasses import dataclass

from otb_diag.errors import InputError
from otb_diag.io.load_options import LoadOptions
from otb_diag.knobs import (
    Checked,
    above,
    at_least,
    comma_ints,
    comma_list,
    each,
    internal,
    joined,
    knob,
    one_of,
    valid_seed,
)
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
    """`90`, `90s`, `30m`, `2h` -> seconds (whether positive, the knob's check says)."""
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


def _compiles(pattern: str) -> str | None:
    """A regular expression `re` compiles (which parameters it matches, the model says)."""
    try:
        re.compile(pattern)
    except re.error as err:
        return f"is not a regular expression ({err}), got '{pattern}'"
    return None


@dataclass(frozen=True)
class VarianceSettings(Checked):
    """Every knob of `otb-diag variance-compare` (the CLI's options, same defaults)."""

    modes: tuple[str, ...] = knob(
        ("proxy", "head"),
        each(one_of(MODES)),
        flag="--mode",
        cli=str,
        parse=comma_list,
        show=joined,
        help="Comma-separated: proxy (forward only; synthetic scores with ‖s_t‖² = w_t), head "
        "(exact output-layer gradients, Kronecker-sketched), full (exact gradients of all "
        "parameters, JL-projected by forward- or reverse-mode autodiff; its cost estimate is "
        "printed first).",
    )
    baselines: tuple[str, ...] = baselines_knob("; must include none and mean", ("none", "mean"))
    aggregations: tuple[str, ...] = knob(
        factory=_default_aggregations,
        check=each(),
        cli=str,
        parse=comma_list,
        show=joined,
        help=lambda: f"Comma-separated, of: {', '.join(aggregation_names())}.",
    )
    group_sizes: tuple[int, ...] = knob(
        factory=_default_group_sizes,
        check=each(at_least(2, " (a group baseline needs two responses)")),
        cli=str,
        parse=lambda text: comma_ints(text, "group sizes", "group-sizes"),
        show=joined,
        help="Group sizes N, each at least 2 and at most M/2 (M: the smallest pool; the draws "
        "of N from M stay varied). The default's sizes above M/2 are left out, so it measures "
        "2-16 on pools of 32 and 2-64 on pools of 128.",
    )
    draws: int = knob(
        200, at_least(2, " (a variance needs two draws)"), help="Groups drawn per prompt and N."
    )
    bootstrap: int = knob(1000, at_least(1), help="Bootstrap resamples.")
    sketch_dim: int = knob(256, at_least(1), help="Dimension k of the projected score vectors.")
    seed: int = knob(0, valid_seed, help="Seed of draws and projections.")
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
        one_of(ENGINES),
        help="Full mode: jvp (forward mode, k passes for all tokens at once; per-token norms "
        "estimated), vjp (reverse mode, one backward per token; exact norms) or auto (the cost "
        "model's choice).",
    )
    params: str | None = knob(
        None,
        _compiles,
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
        at_least(1),
        help="With --by-block: directions per block (default ⌈sketch-dim / blocks⌉). Forward "
        "mode costs one pass per direction and block.",
    )
    budget_s: float | None = knob(
        factory=_default_budget,
        check=above(0),
        flag="--budget",
        cli=str,
        parse=seconds,
        show=duration,
        help="Full mode refuses runs estimated longer than this (e.g. 90s, 30m, 2h) unless "
        "--force.",
    )
    prompts_per_step: int | None = knob(
        None,
        at_least(1),
        help="The batch of prompts your trainer takes a step on: the SNR |G|²/(tr Σ/P) is given "
        "there. Default: the prompts of the rollouts.",
    )
    current_n: int = knob(
        8,
        at_least(1),
        help="The responses per prompt you train with (verl rollout.n, TRL num_generations): "
        "the recommendation compares against mean at this N.",
    )

    def check(self) -> None:
        """Raise `InputError`, at the top of the entry point, before anything is read, for what
        a knob's own check cannot see (each knob's ran when the object was built): a device
        this machine lacks, a baseline or an aggregation its registry does not know, knobs that
        contradict each other, a full-mode knob given without full mode (it would be dropped
        without a word). Not when the object is built: a record read back needs neither the
        registries (`report` stays free of torch) nor a name a user registered at run time,
        and a settings object remade on the way (`measure_knobs.planned`) is checked once."""
        from otb_diag.maths.aggregation import check_aggregation
        from otb_diag.maths.estimators.registry import get_baseline

        self.load.check()  # a device this machine lacks
        for name in self.baselines:
            get_baseline(name)  # an unknown name stops here, listing the known ones
        for name in self.aggregations:
            check_aggregation(name)
        if self.directions_per_block is not None and not self.by_block:
            raise InputError(
                "--directions-per-block splits the directions over the blocks of --by-block: "
                "add --by-block, or leave it out"
            )
        if self.zero_tail_split and ("otb" not in self.baselines or not self.handle_zero_tail):
            raise InputError(
                "--zero-tail-split compares OTB with and without verl's zero tail: it needs otb "
                "among the baselines and the zero tail on."
            )
        if "full" in self.modes:
            return
        given = [
            flag
            for flag, value, default in (
                ("--engine", self.engine, "auto"),
                ("--params", self.params, None),
                ("--by-block", self.by_block, False),
                ("--force", self.force, False),
                ("--budget", self.budget_s, _default_budget()),
            )
            if value != default
        ]
        if given:
            raise InputError(
                f"{', '.join(given)}: only full mode reads {'them' if len(given) > 1 else 'it'}, "
                f"and --mode is {joined(self.modes)}: add full to --mode, or leave "
                f"{'them' if len(given) > 1 else 'it'} out"
            )
