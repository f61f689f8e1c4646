"""The knobs that the commands measuring rollouts under a checkpoint share (`energy`,
`variance-compare`; `train` and `rollouts sample` for some), declared once: each settings
dataclass names its field with one of these, `knob(default, STEPS)`, and so reads and behaves
the same everywhere."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from otb_diag.knobs import (
    Knob,
    above,
    at_least,
    comma_list,
    each,
    joined,
    knob,
    named,
    optional_tuple,
    parse_steps,
    refused_by,
)

if TYPE_CHECKING:
    from torch import nn


STEPS = Knob(
    metavar="A-B", check=refused_by(parse_steps), help="Only rollout rows of training steps A to B."
)
REWARD_COLUMNS = Knob(
    flag="--reward-column",
    metavar="NAME",
    cli=list[str] | None,
    parse=optional_tuple,
    check=each(named),
    help="TRL completion logs: the reward column(s) to sum (repeatable). Default: every "
    "reward-function column.",
)
TEMPERATURE = Knob(check=above(0), help="Sampling temperature τ; default: each row's own.")
BATCH_TOKENS = Knob(check=at_least(1), help="Padded tokens per forward batch.")
ZERO_TAIL = Knob(
    flag="--handle-zero-tail/--no-handle-zero-tail",
    help="verl's OTB option: a strictly longest member gets B_t = 0 beyond the second-longest "
    "length.",
)


def _auto_help(what: str, cpu_size: str) -> Any:
    """Help of an auto size; the CPU's size is read from `policy/forward_pass.py` when shown."""

    def text() -> str:
        from otb_diag.policy import forward_pass

        return (
            f"{what} Default: auto, i.e. planned from the device's free memory on CUDA "
            f"(stats_plan), {getattr(forward_pass, cpu_size)} on the CPU and in "
            "variance-compare's head and full modes."
        )

    return text


def baselines_knob(detail: str, needs: tuple[str, ...] = ()) -> Any:
    """The `--baselines` field of a measuring command (`energy`, `variance-compare`): registry
    names, comma-separated, the registry's defaults when omitted; `detail` ends the help's first
    sentence with what this command asks of the list (an example, the names `needs` it must
    hold). Whether each name is registered, `check()` of the settings says (a registry a user
    extends at run time: a record read back later need not know its names)."""

    def holds(names: tuple[str, ...]) -> str | None:
        missing = [n for n in needs if n not in names]
        return f"must include {' and '.join(missing)}, got {joined(names)}" if missing else None

    return knob(
        factory=default_baselines,
        cli=str,
        parse=comma_list,
        show=joined,
        check=lambda names: each()(names) or holds(names),
        help=f"Comma-separated registry baselines{detail}. Default: the registry's defaults (an "
        "unknown name lists every registered one).",
    )


# The statistics pass's two sizes, as a field of each measuring command's settings (`energy`,
# `variance-compare`): None is auto, resolved by `planned` once the model is loaded.
def batch_tokens_knob() -> Any:
    return knob(None, BATCH_TOKENS, help=_auto_help(BATCH_TOKENS.help_text(), "BATCH_TOKENS"))


def chunk_size_knob() -> Any:
    return knob(
        None,
        at_least(1),
        help=_auto_help("Tokens whose [chunk, V] logits exist at once.", "STATS_CHUNK"),
    )


class Sized(Protocol):
    """The settings of a command whose statistics pass `planned` sizes (energy's, variance's)."""

    @property
    def batch_tokens(self) -> int | None: ...
    @property
    def chunk_size(self) -> int | None: ...


S = TypeVar("S", bound=Sized)


def planned(settings: S, model: nn.Module | None, free_bytes: float | None = None) -> S:
    """`settings` with an auto (None) `batch_tokens` or `chunk_size` replaced by what
    `stats_plan` gives `model` (the CPU's fixed sizes off CUDA; `free_bytes`: the free memory
    to plan for instead of the device's); model-free runs get the CPU's sizes. Sizes given by
    the user are kept."""
    from otb_diag.policy.forward_pass import BATCH_TOKENS as CPU_TOKENS
    from otb_diag.policy.forward_pass import STATS_CHUNK, stats_plan

    if settings.batch_tokens is not None and settings.chunk_size is not None:
        return settings
    chunk, tokens = (STATS_CHUNK, CPU_TOKENS) if model is None else stats_plan(model, free_bytes)
    return replace(
        settings,
        batch_tokens=tokens if settings.batch_tokens is None else settings.batch_tokens,
        chunk_size=chunk if settings.chunk_size is None else settings.chunk_size,
    )


# The registries import torch: settings read them when an object is made or its help is shown.
def default_baselines() -> tuple[str, ...]:
    """The baselines measured when none are named."""
    from otb_diag.maths.estimators.registry import baseline_names

    return baseline_names(defaults_only=True)


def baseline_names() -> tuple[str, ...]:
    from otb_diag.maths.estimators.registry import baseline_names

    return baseline_names()


def aggregation_names() -> tuple[str, ...]:
    from otb_diag.maths.aggregation import AGGREGATIONS

    return tuple(AGGREGATIONS)
