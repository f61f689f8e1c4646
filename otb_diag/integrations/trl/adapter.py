"""OTB diagnostics inside TRL's `GRPOTrainer` or `RLOOTrainer`: `attach(trainer)` and nothing else.

    trainer = GRPOTrainer(...)
    attach(trainer, dump_dir="otb-dumps")   # the one added line
    trainer.train()

This module is TRL's adapter: its hooks and its logger. The rest lives in one module an idea:
which trainers and TRL versions it takes (`support.py`), a step's rows put back together
from the micro-steps (`rows.py`), the trainer-neutral core that gathers them across
processes, measures on its worker thread, pools, watches and records a step (`live_core.py`),
OTB's advantages in place of TRL's (`advantages.py`).

Where the numbers come from (TRL 1.16, `trl/trainer/grpo_trainer.py`; `rloo_trainer.py` has
the same hooks):
- the batch: `_generate_and_score_completions`' rows and `_calculate_rewards`' rewards, put
  back together from the micro-steps and, with several processes, gathered to the main one in
  process order: the whole batch, whole groups, one computation, one log entry, one dump file,
  one step's rows in memory (`rows.py`, `live_core.py:LiveCore.gather`).
- Σπ² and log p: from the loss's own forward. TRL's fused LM head (`add_fused_lm_head`) computes,
  tile by tile, the per-token fields it is asked for; `attach` asks it for `log_sum_sq_probs`
  too, and reads `log_probs` and `log_sum_sq_probs` off the forward `_compute_loss` runs, at no
  extra pass over the logits. Where that forward is not the fused one (a TRL without the field,
  Liger's loss), one extra no-grad forward gives them (`policy/forward_pass.py:checkpoint_stats`);
  `otb/sum_pi2_from_loss_logits` says which (1 or 0).
- the metrics: `step_metrics.py:step_metrics` (the functions of `otb-diag energy`), computed on
  the core's worker thread while the step's backward pass and optimizer step run, then appended
  (at the trainer's `on_step_end`, before it logs) to its own metric lists
  (`trainer._metrics["train"]`), which TRL averages over the logging window and hands to every
  logger: `trainer_state.json`, W&B, TensorBoard.
- the gradient norm of the collapse detector: TRL's logged `grad_norm` (a callback's `on_log`).
- the within/between split and SNR (`split_every`): per-token score vectors of the output layer
  (head mode, `policy/scores/token_scores.py:head_sketch`) from the hidden states of the loss's
  own forward, caught by a hook on the backbone (`split_capture.py`), the logits recomputed from
  them chunk-wise under no_grad (the fused head keeps none); where no hidden state is caught
  (`extra_forward=True`), one extra no-grad forward of the policy gives them
  (`step_metrics.py:split_scores`). Both run before the step's optimizer step, with the weights
  that sampled the batch, each process on its own rows (a forward on one process only would
  stall sharded models). TRL's `loss_type` names the aggregation (`LOSS_AGGREGATION`; RLOO's
  loss is per sequence).
- under DDP, the all-parameter noise scale from the gradient all-reduce (`ddp_noise.py`).

Nothing here changes a number the training computes: the extra fused-head field is computed
beside `log_probs`, the row tag rides along the batch without touching the random stream, and
an error inside a hook is reported once (a warning naming it) and switches the diagnostics off
while the training goes on.
"""

from __future__ import annotations

import contextlib
import functools
import types
import warnings
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from otb_diag.errors import InputError
from otb_diag.integrations.core.dump import check_dump_dir
from otb_diag.integrations.core.live_core import LiveCore
from otb_diag.integrations.core.metric_levels import check_level
from otb_diag.integrations.core.step_metrics import (
    PREFIX,
    check_whole_groups,
    split_scores,
)
from otb_diag.integrations.core.worker import describe
from otb_diag.integrations.trl.advantages import (
    EXTRA_FORWARD,
    AdvantageSwap,
    check_advantages,
    install_swap,
)
from otb_diag.integrations.trl.ddp_noise import install_ddp_noise
from otb_diag.integrations.trl.rows import (
    OUTPUT_KEYS,
    ROW_KEY,
    Pending,
    Rows,
    concat_rows,
    local_rewards,
    no_grad_stats,
    policy,
    rows_of,
    step_batch,
)
from otb_diag.integrations.trl.split_capture import HiddenCatch
from otb_diag.integrations.trl.support import (
    FUSED_OUTPUTS,
    HOOKS,
    LOSS_AGGREGATION,
    SUPPORTED,
    TESTED,
    Supported,
    fused_head,
    log_to_trl,
    sharding,
    supported_trainer,
)
from otb_diag.maths.estimators.registry import get_baseline, trainer_baseline
from otb_diag.maths.response_batch import ResponseBatch
from otb_diag.runtime.torchrun import Dist

LIVE_ATTRIBUTE = "otb_diagnostics"  # the trainer's attribute holding what `attach` installed


class LiveDiagnostics:
    """What `attach` installs on one trainer, in every process. It keeps one batch while the
    micro-steps train on it, the collapse watch's windows, the split pooled over the steps
    (`budget`: a fixed window of step tuples and moments) and the last step's metrics (`last`,
    main process), nothing per step: its memory is the same whatever the run's length, the
    numbers live in the trainer's log.

    With several processes each one collects its share of the step's rows; once the micro-steps
    have trained on all of them (the same micro-step in every process), every process hands its
    share over (`LiveCore.gather`, which also stops every process together on an error) and the
    main one computes, logs and dumps the whole step."""

    def __init__(
        self,
        trainer: Any,
        supported: Supported,
        every: int,
        dump_dir: Path | None,
        baselines: Sequence[str] | None,
        extra_forward: bool,
        split_every: int = 0,
        split_k: int = 64,
        level: str = "default",
    ) -> None:
        self.trainer = trainer
        self.every = every
        self.dump_dir = dump_dir  # written by the main process only
        self.extra_forward = extra_forward
        self.split_every = split_every  # 0: no split
        self.split_k = split_k
        self._pending: Pending | None = None
        self.rewards_per_func: Tensor | None = None  # TRL's `_calculate_rewards`, [B_all, F]
        self._captured: list[tuple[Tensor, Tensor]] | None = None
        self.hidden: HiddenCatch | None = None  # the loss forward's hidden states (`_install`)
        self.params: Any = None  # the all-parameter estimate's callback (`_install`)
        self.swap: AdvantageSwap | None = None  # `attach(advantages=...)`: advantages.py
        documented = all(getattr(trainer, k, None) == v for k, v in supported.documented.items())
        loss_type = getattr(trainer, "loss_type", "")
        # The trainer-neutral core (live_core.py), its split under the trainer's own estimator
        # (when its settings are the documented ones) and OTB; measured on the main process.
        accelerator = trainer.accelerator
        self.core = LiveCore(
            trainer_baseline(supported.registry) if documented else None,
            baselines,
            supported.aggregation or LOSS_AGGREGATION.get(loss_type, ""),
            level=level,
            record_dir=trainer.args.output_dir,
            dump_dir=dump_dir,
            place=Dist(accelerator.process_index, accelerator.num_processes),
        )

    @property
    def enabled(self) -> bool:
        """False once the diagnostics stopped (an error, said once; `LiveCore.fail`)."""
        return self.core.enabled

    @property
    def audited(self) -> tuple[str, dict[str, Any]] | None:
        """The registry estimator the trainer's advantages are (`attach(advantages=...)` sets
        the one it trains with)."""
        return self.core.audited

    @audited.setter
    def audited(self, record: tuple[str, dict[str, Any]] | None) -> None:
        self.core.audited = record

    @property
    def last(self) -> dict[str, float]:
        """The latest measured step's metrics, every one (main process)."""
        return self.core.last

    # -- hooks -------------------------------------------------------------------------------

    def generate(self, original: Callable[..., dict[str, Any]], inputs: Any) -> dict[str, Any]:
        output = original(inputs)
        if self.enabled and self.trainer.model.training:
            self.core.guard(self.trainer.state.global_step + 1, self._start, output)
        return output

    def rewards(self, original: Callable[..., Tensor], *args: Any) -> Tensor:
        rewards_per_func = original(*args)
        self.rewards_per_func = rewards_per_func  # every process's rows
        return rewards_per_func

    def compute_loss(self, original: Callable[..., Tensor], model: Any, inputs: dict) -> Tensor:
        rows = inputs.get(ROW_KEY)
        live = self.enabled and self._pending is not None and rows is not None
        if live:
            self._captured = []
        catch = live and self._pending.scores is not None and self.hidden is not None
        try:
            with self.hidden.catching(catch) if catch else contextlib.nullcontext([]) as hidden:
                loss = original(model, inputs)
        finally:
            captured, self._captured = self._captured, None
        if live:
            self.core.guard(self._pending.step, self._take, inputs, rows, captured, hidden)
        return loss

    def capture(self, output: Any) -> None:
        """Called by the fused forward: keep the loss forward's per-token fields."""
        if self._captured is not None and getattr(output, "log_sum_sq_probs", None) is not None:
            self._captured.append((output.log_probs.detach(), output.log_sum_sq_probs.detach()))

    def on_log(self, logs: dict[str, float], step: int) -> None:
        if "grad_norm" in logs:
            self.core.add_grad_norm(step, float(logs["grad_norm"]))

    # -- the work ----------------------------------------------------------------------------

    def _start(self, output: dict[str, Any]) -> None:
        step = self.trainer.state.global_step + 1  # the step this batch trains (TRL's log step)
        if (step - 1) % self.every:
            return
        missing = [k for k in OUTPUT_KEYS if k not in output]
        if missing:
            raise InputError(
                f"{type(self.trainer).__name__}._generate_and_score_completions returned no "
                f"{', '.join(missing)}: this TRL is not one attach() can read (tested with TRL "
                f"{', '.join(TESTED)}).",
                hint="Install a tested TRL (pip install 'trl==1.16.*').",
            )
        n, c = output["completion_ids"].shape
        device = output["completion_ids"].device
        # The batch is pending and its rows tagged before anything that can fail on one process
        # alone (its rewards, its split's memory): failing there, this process still counts its
        # rows through the micro-steps and hands its error over at the step's gather (`_take`),
        # where the other processes wait for its share. What the micro-steps fill stays on the
        # batch's device until the share is whole: one read to the host a step, not one a
        # micro-step (a read waits for the device, and the trainer's next launches with it).
        p = self._pending = Pending(
            step=step,
            inputs={k: v for k, v in output.items() if isinstance(v, Tensor)},
            rewards=torch.full((n,), torch.nan),  # this process's, below
            logprobs=torch.zeros(n, c, device=device),
            sum_pi2=torch.zeros(n, c, device=device),
            seen=torch.zeros(n, dtype=torch.bool, device=device),
            # the swap's log p and Σπ² trained (a dump holds them), not the loss forward's
            from_loss=not (self.extra_forward or (self.swap and self.swap.needs_energy)),
        )
        output[ROW_KEY] = torch.arange(n, device=device)
        p.rewards = local_rewards(self.trainer, self.rewards_per_func, n)
        logged = (step - 1) // self.every  # this step's rank among the logged steps
        if self.split_every > 0 and logged % self.split_every == 0:
            p.split, p.scores = True, torch.zeros(n, c, self.split_k, device=device)

    def _take(
        self, inputs: dict[str, Any], rows: Tensor, captured: list, hidden: list[Tensor]
    ) -> None:
        p = self._pending
        assert p is not None
        self.core.guard(p.step, self._keep, p, inputs, rows, captured, hidden)
        # Counted, not read: TRL's micro-steps split the batch's rows (each trains once in its
        # first iteration), so the share is whole once as many rows have trained as it holds;
        # `rows_of` checks `seen` in the step's one read. Even after an error: this process
        # still comes to the gather.
        p.seen[rows] = True
        p.taken += rows.numel()
        if self.enabled and p.taken >= len(p.seen):
            self._pending = None
            self._finish(p)

    def _keep(
        self, p: Pending, inputs: dict[str, Any], rows: Tensor, captured: list, hidden: list
    ) -> None:
        """The loss forward's log p and Σπ² of the micro-step's `rows`, and on split steps their
        scores from its hidden states."""
        if p.scores is not None:
            if hidden:  # the split's scores from the loss's own forward (split_capture.py)
                try:
                    p.scores[rows] = self.hidden.scores(
                        hidden, inputs["completion_ids"], self.trainer.temperature, self.split_k
                    )
                except Exception as e:  # noqa: BLE001  the split alone stops
                    self._drop_split(p, describe(e))
            else:
                p.scores = None  # no hidden states caught: one extra forward in `_local_rows`
        if captured and p.from_loss:
            c = p.logprobs.shape[1]  # the fused head scores positions 1..; keep the completion's
            p.logprobs[rows] = torch.cat([lp for lp, _ in captured])[:, -c:].float()
            p.sum_pi2[rows] = torch.cat([lq for _, lq in captured])[:, -c:].float().exp()
        else:
            p.from_loss = False  # this forward was not the fused one: one extra forward

    def _finish(self, p: Pending) -> None:
        """Every process, at the micro-step that trained the last of its rows (before that
        micro-step's backward pass): its share handed over; the main process measures."""
        shares = self.core.gather(p.step, lambda: self._local_rows(p))
        if shares is None:
            return
        if p.split and any(rows.scores is None for rows in shares):
            self.split_every = 0  # a process dropped the split (it has said why): all drop it
        if self.core.place.is_main:
            self.core.guard(p.step, self._submit, p, shares)

    def _local_rows(self, p: Pending) -> Rows:
        """This process's rows of `p`, with log p and Σπ² from one extra forward where the
        loss's forward gave none, and the split's scores on split steps. The scores need the
        weights that sampled the batch: before the optimizer step, here."""
        rows = rows_of(p)
        rows.scores = p.scores.cpu() if p.scores is not None else None  # caught, or None
        extra_split = p.split and p.scores is None
        if not p.from_loss or extra_split:
            own = step_batch(self.trainer, p.step, rows, grouped=False)  # the forward's input
            if not p.from_loss:
                rows.logprobs, rows.sum_pi2 = self._forward_stats(own)
                own = step_batch(self.trainer, p.step, rows, grouped=False)
            if extra_split:
                try:
                    rows.scores = split_scores(policy(self.trainer), own, self.split_k)
                except Exception as e:  # noqa: BLE001  the split alone stops
                    self._drop_split(p, describe(e))
        return rows

    def _drop_split(self, p: Pending, what: str) -> None:
        """The split's scores failed at `p`'s step (its check of the output layer, its extra
        forward): say once why, and go on without the split, the rest of the diagnostics
        untouched (a failure of the split alone once switched every metric off)."""
        warnings.warn(
            f"otb-diag: the within/between split switched off at step {p.step}: {what}. The "
            "other live diagnostics go on; attach(trainer, split_every=None) leaves the split "
            "out from the start.",
            RuntimeWarning,
            stacklevel=4,
        )
        self.split_every = 0
        p.split, p.scores = False, None

    def _submit(self, p: Pending, shares: list[Rows]) -> None:
        """The main process: the step's batch from every process's rows, measured on the core's
        worker thread beside the backward pass and the optimizer step; `collect`, at the step's
        end, logs it before TRL does."""
        rows = concat_rows(shares)
        batch = step_batch(self.trainer, p.step, rows)
        check_whole_groups(batch, f"TRL step {p.step}")
        scores = rows.scores
        if scores is not None:  # zero past each response (the caught ones span the completion)
            scores = scores[:, : batch.valid.shape[1]] * batch.valid[..., None]
        known = {f"{PREFIX}sum_pi2_from_loss_logits": float(p.from_loss)}
        if self.swap is not None and self.swap.needs_energy:
            known[EXTRA_FORWARD] = self.swap.took_forward
        self.core.submit(batch, p.step, scores, known)

    def collect(self) -> None:
        """Log the step's metrics (the trainer's `on_step_end`, before its `log`)."""
        step = self.core.measuring
        if step is not None:
            self.core.guard(step, self._log)

    def _log(self) -> None:
        # The all-parameter estimate joins the pools on the split's steps, which log the step's
        # P, N and L̄ (`dynamics` reading the log back pools the same rows).
        # They join the full record too; the trainer's log has them from `ddp_noise.py` itself.
        params = self.params.last if self.params is not None else {}
        collected = self.core.collect(params)  # the worker's error, if any, is raised here
        if collected is not None:
            logged = self.core.logged(collected[1])
            log_to_trl(self.trainer, {k: v for k, v in logged.items() if k not in params})

    def _forward_stats(self, batch: ResponseBatch) -> tuple[Tensor, Tensor]:
        """log p and Σπ² `[B, T]` of the policy that sampled `batch`: those its advantages were
        computed from (`attach(advantages=...)`), else one no-grad forward."""
        sampled = self.swap.sampled_stats(batch) if self.swap is not None else None
        return sampled if sampled is not None else no_grad_stats(self.trainer, batch)


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
    metrics: str = "default",
) -> LiveDiagnostics:
    """Log OTB diagnostics under `otb/` at every `every`-th step of `trainer` (a constructed
    `trl.GRPOTrainer` or `trl.RLOOTrainer`) and, with `dump_dir`, write each such step's batch
    there as exact-id rollouts (`dump.py`). `baselines` default to the registry's defaults (as
    `otb-diag energy`); `extra_forward=True` takes Σπ² and the split's hidden states from one
    extra no-grad forward each instead of the loss's forward (what a TRL without the fused
    head's field does; for the overhead benchmark). `split_every=K` adds, at every K-th logged
    step (the 1st, the K+1-th, …), the step's noise split within and between prompts, `|G|²`,
    the noise scale and the SNR under the trainer's own estimator and OTB
    (`otb/split/<baseline>/...`), from head-mode score vectors of dimension `split_k`, formed
    from the loss forward's hidden states (one head matmul per token, no extra pass through the
    body; with `extra_forward=True`, one extra no-grad forward); None or 0 switches it off.
    Every split step also logs the split pooled over the split steps so far
    (`otb/budget/<baseline>/<window|ema>/...`, `maths/noise/budget_stream.py`): the pooled
    noise scale and its interval, the SNR at the run's P, the within share, the tokens a step
    at the knee. Under DDP, every step also logs the all-parameter two-batch estimate
    (`otb/split/params/...`, `ddp_noise.py`). `advantages="otb"` (any registry baseline,
    `advantage_options` its options, e.g. `{"handle_zero_tail": False}`) trains with that
    baseline's token-level advantages in place of the trainer's, audited and dumped as the
    estimator that ran (`advantages.py`; each process's groups must be whole).

    `metrics="default"` logs to the trainer's loggers the answers a person reads, at most 20
    `otb/` keys a step (`metric_levels.py:HEADLINE`); `metrics="all"` logs every metric. Either
    way the main process appends every metric of every measured step to
    `<output_dir>/otb_metrics.jsonl`, which `otb-diag dynamics` reads beside
    `trainer_state.json`.

    With several processes (torchrun, accelerate launch), call it in every process, as the
    trainer is built in every process: the step's rows are gathered to the main process, which
    logs the metrics and writes the dump (its `dump_dir`; the others' is not used).

    Raises `InputError`, before anything is changed, for a trainer it does not take, a TRL
    whose trainer lacks a hook, `every` < 1, a `split_every` or `split_k` that is not a whole
    number (≥ 0, ≥ 1), a split under a `loss_type` it does not know, a dump directory that
    the main process cannot write, an unknown baseline or one of its options it does not
    take, an unknown `metrics` level, a trainer `attach` was already called on, or the split
    on a trainer that shards its parameters (FSDP, DeepSpeed ZeRO-3: `split_every=None`). Warns when
    the trainer has already trained (the diagnostics start with its next `train()`)."""
    import trl

    supported = supported_trainer(trainer)
    if isinstance(getattr(trainer, LIVE_ATTRIBUTE, None), LiveDiagnostics):
        raise InputError(
            "attach() was already called on this trainer: a second call would measure every "
            "step twice.",
            hint="Call attach once, after building the trainer and before train(); the object "
            "the first call returned holds its settings.",
        )
    check_level(metrics)
    for name in baselines or ():
        get_baseline(name)  # an unknown one is refused here, not at the first step
    if trainer.state.global_step > 0:
        warnings.warn(
            f"otb-diag: attach() after the trainer trained {trainer.state.global_step} steps: "
            "the diagnostics start with its next train(); attach before train() to measure "
            "from the first step.",
            stacklevel=2,
        )
    if not isinstance(every, int) or every < 1:
        raise InputError(f"every must be a whole number ≥ 1; got {every!r}.")
    split_every = split_every or 0
    if not isinstance(split_every, int) or split_every < 0:
        raise InputError(f"split_every must be a whole number ≥ 0 or None; got {split_every!r}.")
    if not isinstance(split_k, int) or split_k < 1:
        raise InputError(f"split_k must be a whole number ≥ 1; got {split_k!r}.")
    sharded = sharding(trainer)
    if split_every and sharded is not None:
        raise InputError(
            f"the within/between split recomputes the logits from the output layer's weight "
            f"outside the forward pass, where {sharded} holds only a shard of it on each "
            "process; otb-diag has no sharded path for the split of a TRL trainer yet.",
            hint="attach(trainer, split_every=None) runs the other live diagnostics (their "
            "log p and Σπ² come from inside the forward); `otb-diag variance-compare` on a "
            "dumped step and its checkpoint gives the split offline.",
        )
    loss_type = getattr(trainer, "loss_type", None)
    if split_every and supported.aggregation is None and loss_type not in LOSS_AGGREGATION:
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
    if record is not None and supported is not SUPPORTED["GRPOTrainer"]:
        raise InputError(
            f"attach(advantages=...) trains a trl.GRPOTrainer with a registry baseline; got a "
            f"{type(trainer).__name__}.",
            hint="Use a GRPOTrainer (with loss_type and num_generations as you need), or attach "
            "without advantages= for the diagnostics alone.",
        )
    folder = None if dump_dir is None else Path(dump_dir)
    if folder is not None and trainer.accelerator.is_main_process:  # the one that writes it
        folder = check_dump_dir(folder)
    fused = fused_head()
    live = LiveDiagnostics(
        trainer,
        supported,
        every,
        folder,
        baselines,
        extra_forward or fused is None,
        split_every,
        split_k,
        metrics,
    )
    if record is not None:
        install_swap(trainer, live, record)  # W from generate's forwards (or its own)
    _install(trainer, live, fused)
    setattr(trainer, LIVE_ATTRIBUTE, live)
    return live


def _install(trainer: Any, live: LiveDiagnostics, fused: Callable[..., None] | None) -> None:
    """Wrap the trainer's hooks on the instance (the class is left alone)."""
    from transformers import TrainerCallback

    generate, rewards, loss = (getattr(trainer, h) for h in HOOKS)
    trainer._generate_and_score_completions = lambda inputs: live.generate(generate, inputs)
    trainer._calculate_rewards = lambda *a: live.rewards(rewards, *a)
    trainer._compute_loss = lambda model, inputs: live.compute_loss(loss, model, inputs)
    peft = hasattr(trainer.model, "peft_config")  # TRL patches the base model under PEFT
    model = trainer.model.get_base_model() if peft else trainer.model
    if live.split_every and not live.extra_forward:
        live.hidden = HiddenCatch(model)
    if fused is not None and not live.extra_forward:
        fused(
            model,
            temperature=trainer.temperature,
            # RLOOConfig has no cast_lm_head_to_fp32: RLOOTrainer leaves the head as it is
            cast_lm_head_to_fp32=getattr(trainer.args, "cast_lm_head_to_fp32", False),
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

    # First: its metrics are in when `_Live` logs; each step's at the dashboard's level.
    live.params = install_ddp_noise(trainer, lambda m: log_to_trl(trainer, live.core.logged(m)))

    class _Live(TrainerCallback):
        def on_step_end(self, args: Any, state: Any, control: Any, **_: Any) -> None:
            live.collect()

        def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **_: Any) -> None:
            live.on_log(logs or {}, state.global_step)

    trainer.add_callback(_Live())
