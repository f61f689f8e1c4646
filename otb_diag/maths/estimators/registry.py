"""The baseline registry: the one place that knows every baseline and what it needs.

A baseline is one function registered with `@register_baseline`:

    fn(returns: [B, T], mask: [B, T], group: [B] long, energy: [B, T] | None, **options)
        -> advantages [B, T] = (G_t - B_t) * mask_t

and its entry says everything the rest of the package asks about it, so no other module lists
baseline names: whether it needs the realized energy `W` (and so takes the importance weights
as `w·ρ²`), whether it supports verl's TIR re-indexing, its family and variant (`otb-loo` is the
`loo` variant of the `otb` family; the plots colour a family once), which energies measured
from the scores themselves `variance-compare` also runs it on in full mode (`true_energies`,
see `TRUE_ENERGIES`; the row `<name>-<source>`), whether it is in
the defaults of `energy` / `variance-compare` / the API, and the names and options under which
trainers run it (for the advantage audit). The options a baseline takes (`is_weights`, `eps`,
`handle_zero_tail`, `tir`) are read from its signature.

The built-in baselines register when the package `otb_diag.maths.estimators` is imported (its
`__init__` imports `baselines.py` and `otb.py`), so the registry is complete before any query.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from types import MappingProxyType
from typing import Any

from otb_diag.errors import InputError

BaselineFn = Callable[..., Any]  # (returns, mask, group, energy, **options) -> [B, T] Tensor
TRUE_SUFFIX = "-true"  # ends the label of every baseline fed an energy of the scores themselves

# The energies variance-compare's full mode measures from the per-token scores `s_t` in place of
# the proxy `w_t` (source name -> what it is); a baseline's entry names those it takes, and
# its row is labelled `<name>-<source>`. Exact where the scores' norms are (reverse mode); in
# forward mode, and for every cross term, JL estimates from the k projected coordinates.
TOKEN_NORMS, SEQUENCE_NORM = "true", "seqnorm-true"
TRUE_ENERGIES = {
    TOKEN_NORMS: "per-token ‖s_t‖², accumulated to W_t = Σ_{j≤t} ‖s_j‖² (no cross terms)",
    SEQUENCE_NORM: "per-response ‖Σ_t s_t‖² = ‖∇θ log π(τ)‖², cross terms included",
}


@dataclass(frozen=True)
class Baseline:
    """One registry entry (see the module docstring)."""

    name: str
    fn: BaselineFn
    family: str
    variant: str = ""
    needs_energy: bool = False
    true_energies: tuple[str, ...] = ()  # keys of TRUE_ENERGIES
    default: bool = True
    verl: tuple[str, ...] = ()  # verl `algorithm.adv_estimator` names that compute it
    trainers: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)  # trainer -> options

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """The baseline itself: `entry(returns, mask, group, energy, **options)`."""
        return self.fn(*args, **kwargs)

    @cached_property  # read per baseline call; `inspect.signature` costs ~50 µs a time
    def options(self) -> frozenset[str]:
        """Keyword options the function takes (beyond returns, mask, group, energy)."""
        params = inspect.signature(self.fn).parameters
        return frozenset(list(params)[4:])

    @property
    def uses_is_weights(self) -> bool:
        """Takes truncated importance weights ρ (as `w·ρ²` in its energy)."""
        return "is_weights" in self.options


BASELINES: dict[str, Baseline] = {}


def register_baseline(
    name: str,
    *,
    family: str | None = None,
    needs_energy: bool = False,
    true_energies: tuple[str, ...] = (),
    default: bool = True,
    verl: tuple[str, ...] = (),
    trainers: Mapping[str, Mapping[str, Any]] | None = None,
) -> Callable[[BaselineFn], BaselineFn]:
    """Decorator adding `fn` to the registry under `name` (a name can be registered once).

    `family` defaults to `name` without a `-loo` suffix, whose variant is then `loo`."""

    def decorator(fn: BaselineFn) -> BaselineFn:
        if name in BASELINES:
            raise ValueError(f"baseline '{name}' is already registered to {BASELINES[name].fn}")
        if name.endswith(TRUE_SUFFIX):
            raise ValueError(f"'{TRUE_SUFFIX}' is reserved for rows on the scores' own energies")
        unknown = set(true_energies) - set(TRUE_ENERGIES)
        if unknown:
            raise ValueError(
                f"unknown true_energies {sorted(unknown)}; known {list(TRUE_ENERGIES)}"
            )
        stem, _, variant = name.partition("-")
        BASELINES[name] = Baseline(
            name=name,
            fn=fn,
            family=family or (stem if variant == "loo" else name),
            variant=variant if variant == "loo" and family is None else "",
            needs_energy=needs_energy,
            true_energies=tuple(true_energies),
            default=default,
            verl=tuple(verl),
            trainers=MappingProxyType(dict(trainers or {})),
        )
        return fn

    return decorator


def get_baseline(name: str) -> Baseline:
    """The entry registered under `name`; an unknown name lists the known ones."""
    if name not in BASELINES:
        raise InputError(
            f"unknown baseline '{name}'; known baselines: {', '.join(baseline_names())}",
            field="baseline",
        )
    return BASELINES[name]


def baseline_names(*, defaults_only: bool = False) -> tuple[str, ...]:
    """Registered names in registration order (only those in the defaults when asked)."""
    return tuple(n for n, b in BASELINES.items() if b.default or not defaults_only)


def families() -> tuple[str, ...]:
    """Baseline families in registration order (`otb` and `otb-loo` are one family)."""
    return tuple(dict.fromkeys(get_baseline(n).family for n in baseline_names()))


def split_label(label: str) -> tuple[str, str]:
    """(registry name, energy source) of a table label: `optseq-seqnorm-true` is `optseq` on
    `seqnorm-true`, `otb-loo-true` is `otb-loo` on `true`; a name alone has source ""."""
    for source in TRUE_ENERGIES:
        stem = label.removesuffix(f"-{source}")
        if stem != label and stem in BASELINES:
            return stem, source
    return label, ""


def family_of(label: str) -> str | None:
    """The family of a baseline or of a table label such as `otb-true`; None when unknown."""
    entry = BASELINES.get(split_label(label)[0])
    return entry.family if entry else None


def variant_of(label: str) -> str:
    """`loo`, `true`, `seqnorm-true`, `loo-true` or "" for a table label (what the plots tell
    apart by style)."""
    name, source = split_label(label)
    entry = BASELINES.get(name)
    parts = [entry.variant] if entry and entry.variant else []
    return "-".join([*parts, source] if source else parts)


def trainer_baseline(trainer: str) -> tuple[str, dict[str, Any]] | None:
    """(registry name, options) of the estimator a trainer's logs document by default (TRL's
    GRPOTrainer, "trl": `grpo` with its ε; its RLOOTrainer, "trl-rloo": `rloo`), or None when
    the registry knows none for `trainer`."""
    for name in baseline_names():
        entry = BASELINES[name]
        if trainer in entry.trainers:
            return name, dict(entry.trainers[trainer])
    return None


def resolve_name(name: str) -> str:
    """A registry name for `name`, which may also be a verl `adv_estimator` name."""
    if name in BASELINES:
        return name
    for entry in BASELINES.values():
        if name in entry.verl:
            return entry.name
    return get_baseline(name).name  # raises the error listing the known names
