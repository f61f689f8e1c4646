"""OTB diagnostics inside verl's trainer step, and the exact-id dumps verl's own
`rollout_data_dir` lacks (it keeps decoded text only).

verl's V0 `RayPPOTrainer.fit` holds the step's batch (a `DataProto`) once the advantages are
computed; two lines there (docs/live.md, "verl") log the metrics and dump the batch:

    metrics.update(compute_otb_metrics(batch, adv_estimator=self.config.algorithm.adv_estimator))
    dump_batch(batch, "otb-dumps", self.global_steps)

verl 0.9's default V1 trainer builds the `DataProto` from its transfer queue in
`_compute_advantage`, without `responses` and `sum_pi_squared` unless asked (docs/live.md says
how); its `uid` is the prompt's, or the queue's key `{uid}_{session}_{index}`, grouped by the
prompt's uid either way (`io/trainers/verl.py:prompt_uid`).

Fields read, as verl names them (`batch.batch[...]`, `batch.non_tensor_batch["uid"]`):
`responses` `[B, T]`, `response_mask` `[B, T]` (else the last T columns of `attention_mask`),
`old_log_probs` and `sum_pi_squared` `[B, T]` (actor `calculate_sum_pi_squared=true`),
`token_level_rewards` `[B, T]`, `advantages` `[B, T]` (audited when present), `uid` `[B]`, and
when present `prompts` `[B, P]` with the first P columns of `attention_mask` (the prompt ids of
the dump), `rollout_is_weights` `[B, T]` and `otb_scores` `[B, T, k]` (`scores.py`). A
plain dict of those tensors (with `uid`) works the same, so nothing here imports verl.

The metrics are `step_metrics.py:step_metrics`'s, under verl-style names (`otb/...`), so they
sit beside verl's own `variance_proxy/*` on its dashboards; docs/live.md compares the two. Given
the step's per-token score vectors (`scores`, the batch's `otb_scores` formed on the actor
workers, or from the policy `model`, a Hugging Face causal LM), `compute_otb_metrics` adds the
within/between split (`step_metrics.py:split_metrics`) under verl's `adv_estimator` and OTB,
aggregated as the actor's `loss_agg_mode`; `BudgetTracker`, a small object called in its
place, pools that split over the steps (`otb/budget/...`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from otb_diag.errors import InputError
from otb_diag.integrations.core.controller import KneeController
from otb_diag.integrations.core.dump import check_dump_dir, dump_step
from otb_diag.integrations.core.live_core import LiveCore
from otb_diag.integrations.core.options import DEFAULTS, LiveOptions
from otb_diag.integrations.core.step_metrics import (
    check_whole_groups,
    round_off_clamped,
    split_scores,
    step_and_split_metrics,
)
from otb_diag.integrations.verl.scores import OTB_SCORES
from otb_diag.io.trainers.verl import PromptUids
from otb_diag.maths.estimators.registry import resolve_name
from otb_diag.maths.noise.budget_stream import DECAY, WINDOW
from otb_diag.maths.response_batch import ResponseBatch

REQUIRED = ("responses", "old_log_probs", "sum_pi_squared", "token_level_rewards", "uid")
DEFAULT_ESTIMATOR = "grpo"  # the estimator audited when the caller names none
DEFAULT_LOSS_AGG = "token-mean"  # verl's `actor.loss_agg_mode` default


def audited_estimator(adv_estimator: str | None) -> tuple[str, dict[str, Any]] | None:
    """The registry estimator (name, options) verl's `adv_estimator` names; None: no audit."""
    return (resolve_name(adv_estimator), {}) if adv_estimator else None


def compute_otb_metrics(
    batch: Any,
    *,
    adv_estimator: str | None = DEFAULT_ESTIMATOR,
    temperature: float | None = None,
    baselines: Sequence[str] | None = None,
    model: Any = None,
    scores: Tensor | None = None,
    loss_agg_mode: str = DEFAULT_LOSS_AGG,
    split_k: int = DEFAULTS.split_k,
) -> dict[str, float]:
    """The step's `otb/...` metrics over a verl batch (a `DataProto` or a dict of its tensors
    with `uid`): energy, every baseline's proxies, OTB/mean, and the audit of `advantages`
    against `adv_estimator` (verl's `algorithm.adv_estimator`; None skips the audit).
    `temperature` defaults to the batch's `meta_info["temperature"]`, else 1.

    With per-token score vectors, also `otb/split/<baseline>/...` under `adv_estimator` and
    OTB, aggregated as `loss_agg_mode` (the actor's `actor_rollout_ref.actor.loss_agg_mode`).
    The scores, `[B, T, k]` projected per-token scores of `responses`, come from `scores`, else
    from the batch's `otb_scores` (`scores.py:OTB_SCORES`: formed on verl's actor workers
    by `scores.py:forward_scores`), else from `model` (the policy that sampled the batch,
    on one process: head-mode scores of dimension `split_k` from one extra no-grad forward; the
    batch needs `prompts`); the last two give the same numbers."""
    step, scores = step_and_scores(batch, temperature, model, scores, split_k)
    audited = audited_estimator(adv_estimator)
    return step_and_split_metrics(step, audited, baselines, scores, loss_agg_mode)


def step_and_scores(
    batch: Any,
    temperature: float | None = None,
    model: Any = None,
    scores: Tensor | None = None,
    split_k: int = DEFAULTS.split_k,
) -> tuple[ResponseBatch, Tensor | None]:
    """The step's `ResponseBatch` of a verl batch and its split's scores `[B, T, k]` (None: no
    split), as `compute_otb_metrics` takes them (its docstring)."""
    step = verl_batch(batch, temperature)
    if scores is None and model is None:
        scores = _parts(batch)[0].get(OTB_SCORES)  # formed on the workers (scores.py)
    if scores is None and model is not None:
        scores = split_scores(model, step, split_k)
    if scores is not None:
        rows, width = step.mask.shape
        if scores.ndim != 3 or scores.shape[0] != rows or scores.shape[1] < width:
            raise InputError(
                f"scores must be [B, T, k] over the batch's {rows} responses of up to {width} "
                f"tokens; got shape {list(scores.shape)}.",
                field="scores",
            )
    return step, scores


class BudgetTracker:
    """`compute_otb_metrics` across a run's steps, on the live core every adapter shares
    (`live_core.py:LiveCore`): the split pooled over the steps, the collapse watch, the
    dashboard's level, the full record and the worker thread. One per trainer, called where
    `compute_otb_metrics` would be, with its arguments:

        otb = BudgetTracker()                                     # in the trainer's __init__
        metrics.update(otb(batch, step, adv_estimator=..., model=...,
                           grad_norm=metrics.get("actor/grad_norm")))   # each step

    or, to measure while verl's actor updates on its workers (the driver waits for them),
    `otb.submit(...)` with the same arguments before `update_actor` and
    `metrics.update(otb.collect())` after it.

    Its calls with a split (`scores` or `model`) add `otb/budget/<baseline>/<window|ema>/...`
    (`maths/noise/budget_stream.py`); `grad_norm` (verl's last logged `actor/grad_norm`)
    feeds the collapse watch beside the variance proxy (`otb/collapse/...`). `metrics`: the
    level returned (`metric_levels.py`; "all" by default here, since verl's own file log is
    what `dynamics` reads back, and it pools the per-step split), `record_dir`: where to append
    every metric to `otb_metrics.jsonl` (None: nowhere). It keeps `window` step tuples and one
    set of moments per baseline, whatever the run's length."""

    def __init__(
        self,
        window: int = WINDOW,
        decay: float = DECAY,
        *,
        metrics: str = "all",
        record_dir: str | Path | None = None,
        controller: str | None = DEFAULTS.controller,
        prompts_per_step: int | None = None,
        most_prompts: int | None = DEFAULTS.most_prompts,
    ) -> None:
        # verl splits on the calls that pass scores: the tracker has no split_every of its own
        options = LiveOptions(metrics=metrics, controller=controller, most_prompts=most_prompts)
        self.options = options.checked()
        if controller is not None and prompts_per_step is None:
            raise InputError(
                "BudgetTracker(controller=...) needs prompts_per_step, the prompts a step "
                "samples (verl's data.train_batch_size): the controller decides in multiples "
                "of it.",
            )
        self.prompts_per_step = prompts_per_step
        self.record_dir = record_dir
        self.window, self.decay = window, decay
        self.core: LiveCore | None = None  # made at the first call, which names the estimator

    @property
    def prompts_per_update(self) -> int | None:
        """The knee controller's decision: the prompts the next update should take (None
        without the controller); docs/live.md says how to apply it in verl."""
        controller = self.core.controller if self.core is not None else None
        return controller.prompts if controller is not None else None

    def __call__(
        self,
        batch: Any,
        step: int | None = None,
        *,
        grad_norm: float | None = None,
        **options: Any,
    ) -> dict[str, float]:
        """`compute_otb_metrics(batch, **options)`, the collapse watch's and the pooled budget
        after this step, at the tracker's level."""
        self.submit(batch, step, grad_norm=grad_norm, **options)
        return self.collect()

    def submit(
        self,
        batch: Any,
        step: int | None = None,
        *,
        grad_norm: float | None = None,
        adv_estimator: str | None = DEFAULT_ESTIMATOR,
        baselines: Sequence[str] | None = None,
        loss_agg_mode: str = DEFAULT_LOSS_AGG,
        **reading: Any,
    ) -> None:
        """The step's rows and scores read off `batch` on the caller's thread
        (`step_and_scores`, `reading` its arguments; `model=`'s forward runs here, with the
        weights that sampled the batch), its metrics measured on the core's worker thread;
        `collect` takes them."""
        rows, scores = step_and_scores(batch, **reading)
        if self.core is None:
            audited = audited_estimator(adv_estimator)
            self.core = LiveCore(
                audited,
                LiveOptions(baselines=baselines).checked().baselines,
                loss_agg_mode,
                level=self.options.metrics,
                record_dir=self.record_dir,
                window=self.window,
                decay=self.decay,
                controller=self._controller(audited),
            )
        at = step if step is not None else 0
        if grad_norm is not None:
            self.core.add_grad_norm(at, float(grad_norm))
        self.core.submit(rows, at, scores)

    def _controller(self, audited: tuple[str, dict[str, Any]] | None) -> KneeController | None:
        """The knee controller over the pooled knee of the estimator verl trains with."""
        if self.options.controller is None or self.prompts_per_step is None:
            return None
        rule = self.options.rule(self.prompts_per_step)
        return KneeController(rule, audited[0] if audited else "otb")

    def collect(self) -> dict[str, float]:
        """The submitted step's metrics, the collapse watch's and the pooled budget, at the
        tracker's level; {} when none was submitted. Raises the measuring's error."""
        collected = self.core.collect() if self.core is not None else None
        return self.core.logged(collected[1]) if collected is not None else {}


def dump_batch(
    batch: Any, dump_dir: str | Path, step: int, *, temperature: float | None = None
) -> Path:
    """Write the batch as step `step`'s exact-id rollouts in `dump_dir` (`dump.py`), atomically;
    return the file's path."""
    rows = verl_batch(batch, temperature, step)
    if not all(rows.prompt_ids):
        raise InputError(
            "the verl batch has no prompt ids (`prompts` with the `attention_mask` that covers "
            "them): a dumped row needs its prompt's tokens.",
            field="prompts",
            hint="V0's batch has them; at V1's _compute_advantage select 'prompts' too and add "
            "the left-padded prompts and their attention_mask (docs/live.md).",
        )
    return dump_step(check_dump_dir(dump_dir), rows, step)


def verl_batch(batch: Any, temperature: float | None = None, step: int = 0) -> ResponseBatch:
    """The `ResponseBatch` of a verl batch (groups by `uid`, whole groups required)."""
    tensors, uid, meta = _parts(batch)
    missing = [k for k in REQUIRED if k != "uid" and k not in tensors] + (
        ["uid"] if uid is None else []
    )
    if missing:
        raise InputError(
            f"the verl batch has no {', '.join(missing)} (it has: {', '.join(sorted(tensors))}).",
            field=missing[0],
            hint="Call compute_otb_metrics after the advantages are computed, with "
            "actor_rollout_ref.actor.calculate_sum_pi_squared=true.",
        )
    responses = tensors["responses"]
    width = responses.shape[1]
    attention = tensors.get("attention_mask")
    response_attention = attention[:, -width:] if attention is not None else None
    mask = tensors.get("response_mask", response_attention)
    if mask is None:
        raise InputError("the verl batch has neither response_mask nor attention_mask.")
    # A response runs to its last attended token (tool output inside it is attended, not
    # generated: mask 0), or to its last generated one without an attention mask.
    span = (response_attention if response_attention is not None else mask).cpu().bool()
    last = torch.where(span, torch.arange(width), -1).amax(-1)
    names, group = _groups(uid)
    if "prompts" in tensors and attention is not None:
        prompts = tensors["prompts"].cpu()
        keep = attention[:, : prompts.shape[1]].cpu().bool()
        prompt_ids = [ids[k].tolist() for ids, k in zip(prompts, keep, strict=True)]
    else:
        prompt_ids = [[] for _ in range(len(group))]
    tau = temperature if temperature is not None else float(meta.get("temperature", 1.0))
    out = ResponseBatch.from_padded(
        group_names=names,
        group=group,
        prompt_ids=prompt_ids,
        response_ids=responses,
        length=last + 1,
        tool_mask=mask,
        **round_off_clamped(tensors["old_log_probs"], tensors["sum_pi_squared"]),
        temperature=tau,
        step=step,
        token_rewards=tensors["token_level_rewards"],
        trainer_advantage=tensors.get("advantages"),
        is_weights=tensors.get("rollout_is_weights"),
    )
    check_whole_groups(out, "verl batch")
    return out


def _parts(batch: Any) -> tuple[Mapping[str, Tensor], Any, Mapping[str, Any]]:
    """(tensors, uid, meta_info) of a `DataProto` (`.batch`, `.non_tensor_batch`,
    `.meta_info`) or of a dict of tensors."""
    if hasattr(batch, "batch") and hasattr(batch, "non_tensor_batch"):
        tensors = {k: batch.batch[k] for k in batch.batch.keys()}  # noqa: SIM118  a TensorDict
        return tensors, batch.non_tensor_batch.get("uid"), getattr(batch, "meta_info", {}) or {}
    if isinstance(batch, Mapping):
        tensors = {k: v for k, v in batch.items() if isinstance(v, Tensor)}
        return tensors, batch.get("uid"), batch.get("meta_info", {})
    raise InputError(
        f"compute_otb_metrics takes a verl DataProto or a dict of its tensors; got a "
        f"{type(batch).__name__}."
    )


def _groups(uid: Any) -> tuple[list[str], Tensor]:
    """Group names (the prompts' uids, `io/trainers/verl.py:prompt_uid`: V0's uid, or the
    prompt's part of V1's `{uid}_{session}_{index}` keys) in order of first appearance and each
    row's index into them."""
    prompts = PromptUids()
    names: dict[str, int] = {}
    index = [
        names.setdefault(
            prompts(str(u), lambda m, h, i=i: InputError(m, row=i, field="uid", hint=h)), len(names)
        )
        for i, u in enumerate(list(uid))
    ]
    return list(names), torch.tensor(index, dtype=torch.long)
