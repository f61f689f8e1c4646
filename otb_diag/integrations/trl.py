"""OTB diagnostics inside TRL's `GRPOTrainer`: `attach(trainer)` and nothing else.

    trainer = GRPOTrainer(...)
    attach(trainer, dump_dir="otb-dumps")   # the one added line
    trainer.train()

Where the numbers come from (TRL 1.16, `trl/trainer/grpo_trainer.py`):
- the batch: `_generate_and_score_completions` returns `prompt_ids`, `completion_ids`,
  `completion_mask` and `advantages` of the local generation batch, groups as consecutive blocks
  of `num_generations` rows; the rewards come from `_calculate_rewards` (weighted and summed as
  TRL sums them). TRL then shuffles the rows and splits them over the gradient-accumulation
  micro-steps, so each row is tagged with its position (`otb_row`) to put the batch back together.
- Σπ² and log p: from the loss's own forward. TRL's fused LM head (`add_fused_lm_head`) computes,
  tile by tile, the per-token fields it is asked for; `attach` asks it for `log_sum_sq_probs`
  too, and reads `log_probs` and `log_sum_sq_probs` off the forward `_compute_loss` runs, at no
  extra pass over the logits. Where that forward is not the fused one (a TRL without the field,
  Liger's loss), one extra no-grad forward gives them (`policy/forward_pass.py:checkpoint_stats`);
  `otb/sum_pi2_from_loss_logits` says which (1 or 0).
- the metrics: `step_metrics.py:step_metrics` (the functions of `otb-diag energy`), computed on
  a worker thread while the step's backward pass and optimizer step run, then appended (at the
  trainer's `on_step_end`, before it logs) to its own metric lists (`trainer._metrics["train"]`),
  which TRL averages over the logging window and hands to every logger: `trainer_state.json`,
  W&B, TensorBoard.
- the gradient norm of the collapse detector: TRL's logged `grad_norm` (a callback's `on_log`).
- the within/between split and SNR (`split_every`): per-token score vectors of the output layer
  (`policy/scores/token_scores.py:token_scores`, head mode) from one extra no-grad forward of the
  body, run before the step's backward pass (the weights are those that sampled the batch); the
  fused head's capture holds no hidden states, so no score comes from the loss's own forward.
  TRL's `loss_type` names the aggregation (`LOSS_AGGREGATION`).

Nothing here changes a number the training computes: the extra fused-head field is computed
beside `log_probs`, the row tag rides along the batch without touching the random stream, and
an error inside a hook is reported once (a warning naming it) and switches the diagnostics off
while the training goes on.
"""

from __future__ import annotations

import functools
import math
import types
import warnings
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from otb_diag.errors import InputError
from otb_diag.integrations.collapse_watch import CollapseWatch
from otb_diag.integrations.dump import check_dump_dir, dump_step
from otb_diag.integrations.step_metrics import (
    PREFIX,
    check_whole_groups,
    response_batch,
    split_baselines,
    split_metrics,
    split_scores,
    step_metrics,
)
from otb_diag.integrations.trl_advantages import AdvantageSwap, check_advantages, install_swap
from otb_diag.maths.estimators.registry import trainer_baseline
from otb_diag.maths.response_batch import ResponseBatch
from otb_diag.policy.forward_pass import checkpoint_stats

TESTED = ("1.16",)  # TRL minor versions whose GRPOTrainer the tests run
HOOKS = ("_generate_and_score_completions", "_calculate_rewards", "_compute_loss")
ROW_KEY = "otb_row"
FUSED_OUTPUTS = ("log_probs", "entropy", "log_sum_sq_probs")
# TRL's documented estimator (registry: `grpo` with ε = 1e-4) holds under these settings only.
TRL_DEFAULTS = {"scale_rewards": "group", "multi_objective_aggregation": "sum_then_normalize"}
# TRL's `loss_type` -> how its loss averages per-token terms (`maths/aggregation.py`), read off
# `GRPOTrainer._compute_loss`: grpo and sapo average each sequence's tokens, then the
# sequences; bnpo, dapo, cispo, vespo divide by the tokens of the batch; dr_grpo by B times a
# constant length (the padded width here: the split's ratios do not see the constant); luspo
# sums each sequence's tokens and averages the sequences.
LOSS_AGGREGATION = {
    "grpo": "seq-mean-token-mean",
    "sapo": "seq-mean-token-mean",
    "bnpo": "token-mean",
    "dapo": "token-mean",
    "cispo": "token-mean",
    "vespo": "token-mean",
    "dr_grpo": "seq-mean-token-sum-norm",
    "luspo": "seq-mean-token-sum",
}


@dataclass
class _Pending:
    """One generation batch being put back together from the micro-steps that train on it."""

    step: int
    inputs: dict[str, Any]  # the batch as `_generate_and_score_completions` returned it
    rewards: Tensor  # [B]
    logprobs: Tensor  # [B, C] from the loss's forward (filled row by row)
    sum_pi2: Tensor  # [B, C]
    seen: Tensor  # [B] bool
    from_loss: bool = True


class LiveDiagnostics:
    """What `attach` installs on one trainer. It keeps one batch while the micro-steps train on
    it, the collapse watch's windows and the last step's metrics (`last`), nothing per step:
    its memory is the same whatever the run's length, the numbers live in the trainer's log."""

    def __init__(
        self,
        trainer: Any,
        every: int,
        dump_dir: Path | None,
        baselines: Sequence[str] | None,
        extra_forward: bool,
        split_every: int = 0,
        split_k: int = 64,
    ) -> None:
        self.trainer = trainer
        self.every = every
        self.dump_dir = dump_dir
        self.baselines = baselines
        self.extra_forward = extra_forward
        self.split_every = split_every  # 0: no split
        self.split_k = split_k
        self.watch = CollapseWatch()
        self.enabled = True
        self.last: dict[str, float] = {}  # the latest step's metrics (for a user's own use)
        self._pending: _Pending | None = None
        self._rewards: Tensor | None = None
        self._captured: list[tuple[Tensor, Tensor]] | None = None
        self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="otb-diag")
        self._job: tuple[_Pending, Future] | None = None
        self.swap: AdvantageSwap | None = None  # `attach(advantages=...)`: trl_advantages.py
        documented = all(getattr(trainer, k, None) == v for k, v in TRL_DEFAULTS.items())
        self.audited = trainer_baseline("trl") if documented else None
        # The split under TRL's own estimator (when its settings are the documented ones) and OTB.
        self.split_baselines = split_baselines(self.audited)
        self.aggregation = LOSS_AGGREGATION.get(getattr(trainer, "loss_type", ""), "")

    # -- hooks -------------------------------------------------------------------------------

    def generate(self, original: Callable[..., dict[str, Any]], inputs: Any) -> dict[str, Any]:
        output = original(inputs)
        if self.enabled and self.trainer.model.training:
            self._guard(self.trainer.state.global_step + 1, self._start, output)
        return output

    def rewards(self, original: Callable[..., Tensor], *args: Any) -> Tensor:
        rewards_per_func = original(*args)
        self._rewards = rewards_per_func  # [B_all, F], every process's rows
        return rewards_per_func

    def compute_loss(self, original: Callable[..., Tensor], model: Any, inputs: dict) -> Tensor:
        rows = inputs.get(ROW_KEY)
        live = self.enabled and self._pending is not None and rows is not None
        if live:
            self._captured = []
        try:
            loss = original(model, inputs)
        finally:
            captured, self._captured = self._captured, None
        if live:
            self._guard(self._pending.step, self._take, inputs, rows, captured)
        return loss

    def capture(self, output: Any) -> None:
        """Called by the fused forward: keep the loss forward's per-token fields."""
        if self._captured is not None and getattr(output, "log_sum_sq_probs", None) is not None:
            self._captured.append((output.log_probs.detach(), output.log_sum_sq_probs.detach()))

    def on_log(self, logs: dict[str, float], step: int) -> None:
        if "grad_norm" in logs:
            self.watch.add_grad_norm(step, float(logs["grad_norm"]))

    # -- the work ----------------------------------------------------------------------------

    def _guard(self, step: int, fn: Callable[..., None], *args: Any) -> None:
        """Run `fn` (for step `step`); on any error, say so once and switch the diagnostics off
        (the training goes on untouched)."""
        try:
            fn(*args)
        except Exception as e:  # noqa: BLE001  the training must not die of a diagnostic
            self.enabled = False
            self._pending = None
            what = str(e) if isinstance(e, InputError) else f"{type(e).__name__}: {e}"
            warnings.warn(
                f"otb-diag live diagnostics switched off at step {step}: {what}",
                RuntimeWarning,
                stacklevel=2,
            )

    def _start(self, output: dict[str, Any]) -> None:
        step = self.trainer.state.global_step + 1  # the step this batch trains (TRL's log step)
        if (step - 1) % self.every:
            return
        n, c = output["completion_ids"].shape
        rows = self._local_rewards(n)
        self._pending = _Pending(
            step=step,
            inputs={k: v for k, v in output.items() if isinstance(v, Tensor)},
            rewards=rows,
            logprobs=torch.zeros(n, c),
            sum_pi2=torch.zeros(n, c),
            seen=torch.zeros(n, dtype=torch.bool),
            from_loss=not self.extra_forward,
        )
        output[ROW_KEY] = torch.arange(n, device=output["completion_ids"].device)

    def _local_rewards(self, n: int) -> Tensor:
        """This process's rewards `[n]`, formed as TRL forms them: Σ_f weight_f · r_f, NaN
        rewards left out (`nansum`), NaN where every function returned None."""
        assert self._rewards is not None, "TRL scored no completion"
        t = self.trainer
        start = t.accelerator.process_index * n
        per_func = self._rewards[start : start + n].float()  # [n, F]
        weights = t.reward_weights.to(per_func.device)[None, :]
        rewards = (per_func * weights).nansum(1)
        rewards[torch.isnan(per_func).all(1)] = torch.nan
        return rewards.detach().cpu()

    def _take(self, inputs: dict[str, Any], rows: Tensor, captured: list) -> None:
        p = self._pending
        assert p is not None
        rows = rows.cpu()
        if captured and p.from_loss:
            c = p.logprobs.shape[1]  # the fused head scores positions 1..; keep the completion's
            p.logprobs[rows] = torch.cat([lp for lp, _ in captured])[:, -c:].float().cpu()
            p.sum_pi2[rows] = torch.cat([lq for _, lq in captured])[:, -c:].float().exp().cpu()
        else:
            p.from_loss = False  # this forward was not the fused one: one extra forward
        p.seen[rows] = True
        if bool(p.seen.all()):
            self._pending = None
            self._finish(p)

    def _finish(self, p: _Pending) -> None:
        batch = self._batch(p, p.logprobs, p.sum_pi2)
        if not p.from_loss:
            batch = self._batch(p, *self._forward_stats(batch))
        check_whole_groups(batch, f"TRL step {p.step}")
        # The scores need the weights that sampled the batch: before the optimizer step, here.
        logged = (p.step - 1) // self.every  # this step's rank among the logged steps
        split = self.split_every > 0 and logged % self.split_every == 0
        scores = split_scores(self._policy(), batch, self.split_k) if split else None
        # The tables are computed beside the backward pass and the optimizer step (torch's
        # kernels release the GIL); `collect`, at the step's end, logs them before TRL does.
        self._job = (p, self._worker.submit(self._measure, batch, p.step, scores))

    def _measure(self, batch: ResponseBatch, step: int, scores: Tensor | None) -> dict[str, float]:
        metrics = step_metrics(batch, self.audited, self.baselines)
        if scores is not None:
            metrics |= split_metrics(batch, scores, self.split_baselines, self.aggregation)
        if self.dump_dir is not None:
            dump_step(self.dump_dir, batch, step, self.audited)
        return metrics

    def collect(self) -> None:
        """Log the step's metrics (the trainer's `on_step_end`, before its `log`)."""
        if self._job is not None:
            p, job = self._job
            self._job = None
            self._guard(p.step, self._log, p, job)

    def _log(self, p: _Pending, job: Future) -> None:
        metrics = job.result()  # the worker's error, if any, is raised here
        proxy = metrics.get(f"{PREFIX}proxy/grpo/proxy2_total_power")
        if proxy is not None:
            self.watch.add_variance(p.step, proxy)
        metrics.update({PREFIX + k: v for k, v in self.watch.metrics().items()})
        metrics[f"{PREFIX}sum_pi2_from_loss_logits"] = float(p.from_loss)
        self.last = metrics
        logged = self.trainer._metrics["train"]
        for name, value in metrics.items():
            if math.isfinite(value):  # an undefined z or ratio is left out, not logged as NaN
                logged[name].append(value)

    def _batch(self, p: _Pending, logprobs: Tensor, sum_pi2: Tensor) -> ResponseBatch:
        t, x = self.trainer, p.inputs
        n, c = x["completion_ids"].shape
        generations = t.num_generations
        prompt_mask = x["prompt_mask"].bool().cpu()
        prompts = [
            ids[m].tolist() for ids, m in zip(x["prompt_ids"].cpu(), prompt_mask, strict=True)
        ]
        if n % generations or any(prompts[i] != prompts[i - i % generations] for i in range(n)):
            raise InputError(
                f"the step's groups are not whole: {n} rows on this process are not blocks of "
                f"num_generations={generations} completions of one prompt each.",
                hint="Make the per-process generation batch a multiple of num_generations.",
            )
        completion_mask = x["completion_mask"].cpu()
        tool = completion_mask * x["tool_mask"].cpu() if "tool_mask" in x else completion_mask
        # A response runs to its last completion token (mask 1); a truncated one that TRL
        # masked out entirely (`mask_truncated_completions`) to the full width.
        positions = torch.arange(c)
        last = torch.where(completion_mask.bool(), positions, -1).amax(-1)
        length = torch.where(last >= 0, last + 1, c)
        groups = torch.arange(n) // generations
        return response_batch(
            group_names=[f"s{p.step}-g{k}" for k in range(n // generations)],
            group=groups,
            prompt_ids=prompts,
            response_ids=x["completion_ids"],
            length=length,
            tool_mask=tool,
            logprobs=logprobs,
            sum_pi2=sum_pi2,
            temperature=t.temperature,
            step=p.step,
            reward=p.rewards,
            trainer_advantage=x["advantages"],
        )

    def _policy(self) -> torch.nn.Module:
        """The trainer's model, unwrapped from its accelerator."""
        return self.trainer.accelerator.unwrap_model(self.trainer.model)

    def _forward_stats(self, batch: ResponseBatch) -> tuple[Tensor, Tensor]:
        """log p and Σπ² `[B, T]` of the policy that sampled `batch`: those its advantages were
        computed from (`attach(advantages=...)`), else one no-grad forward."""
        sampled = self.swap.sampled_stats(batch) if self.swap is not None else None
        return sampled if sampled is not None else self.no_grad_stats(batch)

    def no_grad_stats(self, batch: ResponseBatch) -> tuple[Tensor, Tensor]:
        """log p and Σπ² `[B, T]` from one no-grad forward of the policy."""
        model = self._policy()
        was_training = model.training
        model.eval()
        try:
            with torch.no_grad():
                stats = checkpoint_stats(model, batch)
        finally:
            model.train(was_training)
        return stats.logprob, stats.sum_pi2


def attach(
    trainer: Any,
    every: int = 1,
    dump_dir: str | Path | None = None,
    *,
    baselines: Sequence[str] | None = None,
    extra_forward: bool = False,
    split_every: int | None = 10,
    split_k: int = 64,
    advantages: str | None = None,
    advantage_options: Mapping[str, Any] | None = None,
) -> LiveDiagnostics:
    """Log OTB diagnostics under `otb/` at every `every`-th step of `trainer` (a constructed
    `trl.GRPOTrainer`) and, with `dump_dir`, write each such step's batch there as exact-id
    rollouts (`dump.py`). `baselines` default to the registry's defaults (as `otb-diag energy`);
    `extra_forward=True` takes Σπ² from one extra no-grad forward instead of the loss's logits
    (what a TRL without the fused head's field does; for the overhead benchmark).
    `split_every=K` adds, at every K-th logged step (the 1st, the K+1-th, …), the step's noise
    split within and between prompts, `|G|²`, the noise scale and the SNR under TRL's own
    estimator and OTB (`otb/split/<baseline>/...`), from head-mode score vectors of dimension
    `split_k`: one extra no-grad forward of the policy on those steps; None or 0 switches it off.
    `advantages="otb"` (any registry baseline, `advantage_options` its options, e.g.
    `{"handle_zero_tail": False}`) trains with that baseline's token-level advantages in place
    of TRL's, audited and dumped as the estimator that ran (`trl_advantages.py`).

    Raises `InputError`, before anything is changed, for a trainer that is not a GRPOTrainer, a
    TRL whose trainer lacks a hook, `every` < 1, a `split_every` or `split_k` that is not a
    whole number (≥ 0, ≥ 1), a split under a `loss_type` it does not know, or a dump directory
    that cannot be written, an unknown baseline or one of its options it does not take."""
    import trl

    if not isinstance(trainer, trl.GRPOTrainer):
        raise InputError(
            f"attach() takes a trl.GRPOTrainer; got a {type(trainer).__name__}.",
            hint="Construct the GRPOTrainer first, then call attach(trainer) before train().",
        )
    missing = [h for h in HOOKS if not callable(getattr(trainer, h, None))]
    if missing:
        raise InputError(
            f"TRL {trl.__version__}'s GRPOTrainer has no {', '.join(missing)}, the hook(s) "
            f"attach() uses; it is tested with TRL {', '.join(TESTED)}.",
            hint="Install a tested TRL (pip install 'trl==1.16.*'), or dump the batches "
            "yourself and run otb-diag energy on them.",
        )
    if not isinstance(every, int) or every < 1:
        raise InputError(f"every must be a whole number ≥ 1; got {every!r}.")
    split_every = split_every or 0
    if not isinstance(split_every, int) or split_every < 0:
        raise InputError(f"split_every must be a whole number ≥ 0 or None; got {split_every!r}.")
    if not isinstance(split_k, int) or split_k < 1:
        raise InputError(f"split_k must be a whole number ≥ 1; got {split_k!r}.")
    loss_type = getattr(trainer, "loss_type", None)
    if split_every and loss_type not in LOSS_AGGREGATION:
        raise InputError(
            f"the split needs the aggregation of TRL's loss_type {loss_type!r}, which otb-diag "
            f"does not know (it knows {', '.join(LOSS_AGGREGATION)}).",
            hint="attach(trainer, split_every=None) logs everything but the split.",
        )
    if ".".join(trl.__version__.split(".")[:2]) not in TESTED:
        warnings.warn(
            f"otb-diag live diagnostics are tested with TRL {', '.join(TESTED)}, not "
            f"{trl.__version__}; the hooks exist, the audit will say if the numbers agree.",
            stacklevel=2,
        )
    record = check_advantages(advantages, advantage_options) if advantages is not None else None
    folder = check_dump_dir(dump_dir) if dump_dir is not None else None
    fused = _fused_head()
    live = LiveDiagnostics(
        trainer, every, folder, baselines, extra_forward or fused is None, split_every, split_k
    )
    if record is not None:
        install_swap(trainer, live, record)  # W from its own forward: the loss's is not needed
        live.extra_forward = live.extra_forward or live.swap.needs_energy
    _install(trainer, live, fused)
    return live


def _fused_head() -> Callable[..., None] | None:
    """TRL's `add_fused_lm_head` when it can compute `log_sum_sq_probs`, else None."""
    try:
        from trl.kernels.chunked_logprob import OPTIONAL_OUTPUTS
        from trl.trainer.utils import add_fused_lm_head
    except ImportError:
        return None
    return add_fused_lm_head if "log_sum_sq_probs" in OPTIONAL_OUTPUTS else None


def _install(trainer: Any, live: LiveDiagnostics, fused: Callable[..., None] | None) -> None:
    """Wrap the trainer's hooks on the instance (the class is left alone)."""
    from transformers import TrainerCallback

    generate, rewards, loss = (getattr(trainer, h) for h in HOOKS)
    trainer._generate_and_score_completions = lambda inputs: live.generate(generate, inputs)
    trainer._calculate_rewards = lambda *a: live.rewards(rewards, *a)
    trainer._compute_loss = lambda model, inputs: live.compute_loss(loss, model, inputs)
    if fused is not None and not live.extra_forward:
        peft = hasattr(trainer.model, "peft_config")  # TRL patches the base model under PEFT
        model = trainer.model.get_base_model() if peft else trainer.model
        fused(
            model,
            temperature=trainer.temperature,
            cast_lm_head_to_fp32=trainer.args.cast_lm_head_to_fp32,
            outputs=FUSED_OUTPUTS,
        )
        forward = model.forward

        # `generate` checks its keyword arguments against the forward's signature: keep it.
        @functools.wraps(type(model).forward)
        def capturing(self: Any, *args: Any, **kwargs: Any) -> Any:
            output = forward(*args, **kwargs)
            if kwargs.get("fused_lm_head") and torch.is_grad_enabled():
                live.capture(output)
            return output

        model.forward = types.MethodType(capturing, model)

    class _Live(TrainerCallback):
        def on_step_end(self, args: Any, state: Any, control: Any, **_: Any) -> None:
            live.collect()

        def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **_: Any) -> None:
            live.on_log(logs or {}, state.global_step)

    trainer.add_callback(_Live())
