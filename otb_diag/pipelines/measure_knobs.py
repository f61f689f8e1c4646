"""The knobs that the commands measuring rollouts under a checkpoint share (`energy`,
`variance-compare`; `train` and `rollouts sample` for some), declared once: each settings
dataclass names its field with one of these, `knob(default, STEPS)`, and so reads and behaves
the same everywhere."""

from __future__ import annotations

from otb_diag.knobs import Knob, optional_tuple

STEPS = Knob(metavar="A-B", help="Only rollout rows of training steps A to B.")
REWARD_COLUMNS = Knob(
    flag="--reward-column",
    metavar="NAME",
    cli=list[str] | None,
    parse=optional_tuple,
    help="TRL completion logs: the reward column(s) to sum (repeatable). Default: every "
    "reward-function column.",
)
TEMPERATURE = Knob(help="Sampling temperature τ; default: each row's own.")
BATCH_TOKENS = Knob(help="Padded tokens per forward batch.")
CHUNK_SIZE = Knob(help="Tokens whose [chunk, V] logits exist at once.")
ZERO_TAIL = Knob(
    flag="--handle-zero-tail/--no-handle-zero-tail",
    help="verl's OTB option: a strictly longest member gets B_t = 0 beyond the second-longest "
    "length.",
)
BASELINES_DEFAULT = "Default: the registry's defaults (an unknown name lists every registered one)."


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
