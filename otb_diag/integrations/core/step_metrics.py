"""One training step's OTB diagnostics, as the flat `otb/...` scalars a trainer logs.

Both integrations (TRL's `GRPOTrainer`, verl's trainer step) hand the step's batch over as a
`ResponseBatch` carrying the policy's own per-token `logprobs` and `sum_pi2` (Σπ² of the
tempered distribution that sampled the tokens) and the trainer's advantages; `step_metrics`
then runs the very functions `otb-diag energy --model-free` runs on the same rows
(`token_stats.logged_stats`, `tables.energy_tables`, the trainer audit), so a dumped step read
back by `energy` gives the logged numbers again (tests/integrations/test_trl_live.py).

Both build the batch from the trainer's padded tensors with the constructor
`io/rollouts/to_batch.py:make_batch` builds it with from the dumped rows (`dump.py`),
`ResponseBatch.from_padded`, after `round_off_clamped` has cleaned `logprobs` and `sum_pi2` as
the reader cleans the rows: same widths, same padding, same float32 values, so the two routes
agree to the last bit.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import Tensor

from otb_diag.errors import InputError
from otb_diag.io.training_logs import OTB_PREFIX
from otb_diag.maths.energy.tables import (
    ZERO_TAIL,
    ZERO_TAIL_PROXIES,
    advantages_and_proxies,
    step_summary,
)
from otb_diag.maths.energy.token_stats import logged_stats
from otb_diag.maths.estimators.advantages import Estimator, batch_advantages, has_tool_output
from otb_diag.maths.estimators.registry import baseline_names
from otb_diag.maths.estimators.trainer_audit import advantage_audit
from otb_diag.maths.noise.budget_stream import SPLIT
from otb_diag.maths.noise.step_split import (
    SPLIT_SEED,
    response_contributions,
    step_shape,
    step_split,
    without_rounding,
)
from otb_diag.maths.response_batch import ResponseBatch
from otb_diag.policy.scores.token_scores import token_scores

PREFIX = OTB_PREFIX  # every live metric's, as the training-log reader knows them
# The proxies logged per baseline (`maths/energy/proxies.py`: verl's names carry verl's numbers,
# ours our raw-logit convention); `expected_w` does not depend on the baseline and is logged once.
PER_BASELINE = (
    "proxy2_total_power",
    "logit_total_power",
    "token_total_power",
    "expected_a_squared",
)
RATIOS = ("proxy2_total_power", "token_total_power")  # OTB's over the mean baseline's
# The step's `tables.step_summary` logged as `energy/<name>` and `groups/<name>`.
ENERGY = ("sequence_mean", "sequence_median", "mean_w", "group_cv_median")
GROUPS = ("mixed_rewards_fraction", "empty_responses")
SPLIT_MODE = "head"  # the split's score vectors: the output layer's (an extra forward, or caught)


def round_off_clamped(logprobs: Tensor, sum_pi2: Tensor) -> dict[str, Tensor]:
    """`logprobs`, `sum_pi2` (`[B, C]`, float32 on the CPU) with the round-off clamps the
    rollout reader applies (`io/rollouts/probability_checks.py`): `log p ≤ 0` and
    `p² ≤ Σπ² ≤ 1`, p² taken in float64 as the reader takes it, so the dumped rows read back as
    these very tensors. A float32 `exp(log Σπ²)` from the fused head can fall an ulp below `p²`
    when one token holds nearly all the mass. Keyed as `ResponseBatch.from_padded` takes them."""
    logprobs = logprobs.detach().cpu().to(torch.float32).clamp_max(0.0)
    sum_pi2 = sum_pi2.detach().cpu().to(torch.float32)
    p_sq = torch.exp(2 * logprobs.double())
    clamped = torch.minimum(torch.maximum(sum_pi2.double(), p_sq), torch.ones_like(p_sq))
    sum_pi2 = torch.where(sum_pi2 > 0, clamped, sum_pi2.double()).to(torch.float32)
    return {"logprobs": logprobs, "sum_pi2": sum_pi2}


def check_whole_groups(batch: ResponseBatch, where: str) -> None:
    """An `InputError` unless every group has at least two responses and all have the same
    number: a baseline is a statistic of the whole group, and a trainer that splits groups
    across processes hands each process pieces of them."""
    sizes = torch.bincount(batch.group, minlength=len(batch.group_names))
    if len(sizes) and (int(sizes.min()) < 2 or int(sizes.min()) != int(sizes.max())):
        small = int(sizes.argmin())
        raise InputError(
            f"{where}: the step's groups are not whole: group '{batch.group_names[small]}' has "
            f"{int(sizes[small])} responses, others up to {int(sizes.max())}; every baseline "
            "needs all of a group's responses.",
            hint="Give each process whole groups (its batch a multiple of the group size), or "
            "compute the metrics on the gathered batch.",
        )


def step_metrics(
    batch: ResponseBatch,
    audited: tuple[str, dict[str, Any]] | None,
    baselines: Sequence[str] | None = None,
    *,
    handle_zero_tail: bool = True,
) -> dict[str, float]:
    """The step's `otb/...` scalars (names in docs/live.md), computed as `otb-diag energy
    --model-free` computes them on the same rows: the energy of each sequence
    `W(τ) = Σ_t mask_t w_t` with `w = (1 − 2p + Σπ²)/τ²`, its within-group spread, every
    baseline's variance proxies and OTB's over the mean baseline's, and the audit of the
    trainer's advantages against `audited`, the registry baseline and options the trainer
    runs (`registry.trainer_baseline("trl")`; verl's `adv_estimator`), when given. OTB's
    proxies come with their zero-tail parts (`otb/proxy/otb/zero_tail/<proxy>`) and OTB/mean
    without them (`otb/otb_over_mean/without_zero_tail/<proxy>`); responses with no generated
    token are kept, counted in `otb/groups/empty_responses`."""
    names = baseline_names(defaults_only=True) if baselines is None else tuple(baselines)
    stats = logged_stats(batch)
    estimator = Estimator(handle_zero_tail, has_tool_output(batch.mask, batch.valid))
    computed, proxies_of = advantages_and_proxies(batch, stats.w, names, estimator)
    summary = step_summary(batch, computed.energy)
    out: dict[str, float] = {f"energy/{k}": summary[k] for k in ENERGY}
    out |= {f"groups/{k}": summary[k] for k in GROUPS}
    for name, proxies in proxies_of.items():
        out.update({f"proxy/{name}/{p}": proxies[p] for p in PER_BASELINE})
        out["proxy/expected_w"] = proxies["expected_w"]
    if "otb" in proxies_of:
        otb = proxies_of["otb"]
        out.update({f"proxy/otb/{ZERO_TAIL}{p}": otb[ZERO_TAIL + p] for p in ZERO_TAIL_PROXIES})
        if "mean" in proxies_of:
            mean = proxies_of["mean"]
            for p in RATIOS:
                out[f"otb_over_mean/{p}"] = _ratio(otb[p], mean[p])
                rest = otb[p] - otb[ZERO_TAIL + p]
                out[f"otb_over_mean/without_{ZERO_TAIL}{p}"] = _ratio(rest, mean[p])
    if batch.trainer_advantage is not None and audited is not None:
        baseline, options = audited
        audit = advantage_audit(
            batch, stats.w, baseline, Estimator(handle_zero_tail, estimator.tir, options=options)
        )
        assert audit is not None  # the batch carries trainer advantages
        out["audit/max_abs_diff"] = audit["max_abs_diff"]
        out["audit/agrees"] = float(audit["agrees"])
    return {PREFIX + k: v for k, v in out.items()}


def split_scores(model: torch.nn.Module, batch: ResponseBatch, k: int) -> Tensor:
    """`[B, T, k]` the split's per-token score vectors of `batch` under `model` (the policy that
    sampled it): head mode, one extra no-grad forward, the same projection at every step."""
    return token_scores(model, batch, SPLIT_MODE, k, SPLIT_SEED).proj


def split_baselines(
    audited: tuple[str, dict[str, Any]] | None,
) -> dict[str, dict[str, Any]]:
    """The baselines a split is logged under: the trainer's own (`audited`, the registry name
    and options it runs, when known) and OTB."""
    own = [audited] if audited is not None else []
    return dict([*own, ("otb", {})])


def split_metrics(
    batch: ResponseBatch,
    scores: Tensor,
    baselines: Mapping[str, Mapping[str, Any]],
    aggregation: str,
    *,
    handle_zero_tail: bool = True,
) -> dict[str, float]:
    """`otb/split/<baseline>/<name>` for every name of `step_split.SPLIT`: the step's noise
    split within and between its prompts, `|G|²`, the noise scale and the SNR at the step's
    prompts (`maths/noise/step_split.py`), under each registry baseline of `baselines`
    (name -> the options it runs with, e.g. the trainer's ε) and the trainer's `aggregation`
    (a `maths/aggregation.py` name); and `otb/split/<shape>` for the step's prompts, group size
    and mean generated tokens a response (`budget_stream.STEP_SHAPE`), which pooling the split
    over steps needs (`maths/noise/budget_stream.py`).

    scores: `[B, C, k]` projected per-token scores of the batch's responses (C ≥ its width),
    e.g. `split_scores(model, batch, k)`. The advantages are the
    one estimator's (`batch_advantages`) on the logged w and the batch's importance weights, as
    `step_metrics` computes them, less their rounding (`step_split.without_rounding`)."""
    stats = logged_stats(batch)
    tir = has_tool_output(batch.mask, batch.valid)
    scores = scores[:, : batch.mask.shape[1]].cpu()
    out = {SPLIT + k: v for k, v in step_shape(batch.mask, batch.group).items()}
    for name, options in baselines.items():
        estimator = Estimator(handle_zero_tail, tir, options=dict(options))
        found = batch_advantages(batch, stats.w, [name], estimator)
        advantages = without_rounding(found.by_baseline[name], found.returns)
        x = response_contributions(scores, advantages, batch.mask, aggregation)  # [B, k]
        out.update({f"{SPLIT}{name}/{k}": v for k, v in step_split(x, batch.group).items()})
    return {PREFIX + k: v for k, v in out.items()}


def step_and_split_metrics(
    batch: ResponseBatch,
    audited: tuple[str, dict[str, Any]] | None,
    baselines: Sequence[str] | None,
    scores: Tensor | None,
    aggregation: str,
    split_under: Mapping[str, Mapping[str, Any]] | None = None,
) -> dict[str, float]:
    """What an integration logs at a step: `step_metrics`, and on the steps that have the
    split's scores (`[B, C, k]`, C ≥ the batch's width; None: no split) `split_metrics` under
    the trainer's `aggregation` and the baselines `split_under` (name -> options; None: the
    trainer's own and OTB, `split_baselines(audited)`)."""
    metrics = step_metrics(batch, audited, baselines)
    if scores is not None:
        under = split_baselines(audited) if split_under is None else split_under
        metrics |= split_metrics(batch, scores, under, aggregation)
    return metrics


def _ratio(a: float, b: float) -> float:
    return a / b if b > 0 else math.nan
