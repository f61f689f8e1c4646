"""OTB diagnostics inside TRL's `GRPOTrainer` or `RLOOTrainer`: `attach(trainer)` and nothing else.

    trainer = GRPOTrainer(...)
    attach(trainer, dump_dir="otb-dumps")   # the one added line
    trainer.train()

This module is TRL's adapter: its hooks and its logger. The rest lives in one module an idea:
which trainers and TRL versions it takes (`support.py`), a step's rows put back together from
the micro-steps (`rows.py`), OTB's advantages in place of TRL's (`advantages.py`), the split's
hidden states (`split_capture.py`), the all-parameter noise scale under DDP (`ddp_noise.py`),
the knee controller's updates (`update_gate.py`); the trainer-neutral core gathers a step's rows
across processes, measures them in its worker process, pools, watches and records
(`core/live_core.py`).

Where the numbers come from (TRL 1.16, `trl/trainer/grpo_trainer.py`; `rloo_trainer.py` has
the same hooks):
- the batch: `_generate_and_score_completions`' rows and `_calculate_rewards`' rewards, put
  back together from the micro-steps and gathered to the main process in process order: the
  whole batch, whole groups, one computation, one log entry, one dump file.
- Σπ² and log p: from the loss's own forward, whose fused LM head (`add_fused_lm_head`) is asked
  for `log_sum_sq_probs` beside `log_probs`, at no extra pass over the logits; where that
  forward is not the fused one (a TRL without the field, Liger's loss), one extra no-grad
  forward (`policy/forward_pass.py:checkpoint_stats`); `otb/sum_pi2_from_loss_logits` says
  which (1 or 0).
- the metrics: `core/step_metrics.py:step_metrics` (the functions of `otb-diag energy`),
  measured while the step's backward pass and optimizer step run, then appended (at
  `on_step_end`, before the trainer logs) to TRL's own metric lists (`trainer._metrics`),
  which every logger gets: `trainer_state.json`, W&B, TensorBoard.
- the gradient norm of the collapse detector: TRL's logged `grad_norm` (`on_log`).
- the within/between split (`split_every`): head-mode score vectors of the output layer from the
  hidden states of the loss's own forward, or (`extra_forward=True`) of one extra no-grad
  forward (`step_metrics.py:split_scores`), before the step's optimizer step, each process on
  its own rows; TRL's `loss_type` names the aggregation (`LOSS_AGGREGATION`). Under DeepSpeed
  ZeRO-3 or FSDP2 the output layer is gathered for the scoring, every process scoring at the
  same micro-steps, and no extra forward is taken (`split_capture.py`).

Nothing here changes a number the training computes: the extra fused-head field is computed
beside `log_probs`, the row tag rides along the batch without touching the random stream, and
an error inside a hook is reported once (a warning naming it) and switches the diagnostics off
while the training goes on.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from otb_diag.errors import InputError
from otb_diag.integrations.core.controller import KneeController
from otb_diag.integrations.core.dump import check_dump_dir
from otb_diag.integrations.core.live_core import LiveCore
from otb_diag.integrations.core.options import DEFAULTS, LiveOptions
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
    check_swap,
    install_swap,
)
from otb_diag.integrations.trl.ddp_noise import install_ddp_noise
from otb_diag.integrations.trl.kl_penalty import KlPenalty
from otb_diag.integrations.trl.rows import (
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
from otb_diag.integrations.trl.split_capture import HiddenCatch, split_dropped
from otb_diag.integrations.trl.support import (
    HOOKS,
    LOSS_AGGREGATION,
    SUPPORTED,
    Supported,
    capture_fused,
    check_split_tokens,
    check_trainer,
    fused_head,
    log_to_trl,
    sharding,
    supported_trainer,
)
from otb_diag.integrations.trl.update_gate import UpdateGate, check_gate
from otb_diag.policy.causal_lm import causal_lm
from otb_diag.policy.forward_pass import output_layer
from otb_diag.runtime.torchrun import Dist

LIVE_ATTRIBUTE = "otb_diagnostics"  # the trainer's attribute holding what `attach` installed
# Why a sharded policy takes no extra forward (support.py:check_trainer refuses asking for one)
NO_EXTRA = (
    "under sharding an extra forward of each process's own rows would not match the other "
    "processes' collectives, so none is taken"
)


class LiveDiagnostics:
    """What `attach` installs on one trainer, in every process: one batch kept while the
    micro-steps train on it, and the live core (its memory the same whatever the run's length).
    With several processes each one collects its share of the step's rows; once the micro-steps
    have trained on all of them, every process hands its share over (`LiveCore.gather`, which
    also stops every process together on an error) and the main one measures the whole step."""

    def __init__(
        self,
        trainer: Any,
        supported: Supported,
        options: LiveOptions,
        dump_dir: Path | None,
        extra_forward: bool,
    ) -> None:
        self.trainer = trainer
        self.every = options.every
        self.dump_dir = dump_dir  # written by the main process only
        self.extra_forward = extra_forward
        self.split_every = options.split_every  # 0: no split
        self.split_k = options.split_k
        self._pending: Pending | None = None
        self.rewards_per_func: Tensor | None = None  # TRL's `_calculate_rewards`, [B_all, F]
        self._captured: list[tuple[Tensor, Tensor]] | None = None
        self.hidden: HiddenCatch | None = None  # the loss forward's hidden states (`_install`)
        self.params: Any = None  # the all-parameter estimate's callback (`_install`)
        self.swap: AdvantageSwap | None = None  # `attach(advantages=...)`: advantages.py
        self.gate: UpdateGate | None = None  # `attach(controller=...)`: update_gate.py
        self.sharded = sharding(trainer)  # "DeepSpeed ZeRO-3", "FSDP2" (support.py) or None
        # RLOOTrainer's rewards less β·KL: the rewards its advantages are formed from
        self.kl = KlPenalty(trainer) if supported.kl_in_rewards and trainer.beta else None
        audited = supported.audited(trainer)  # the registry estimator its settings make
        loss_type = getattr(trainer, "loss_type", "")
        accelerator = trainer.accelerator
        place = Dist(accelerator.process_index, accelerator.num_processes)
        controller = None
        if options.controller is not None:  # the knee of the estimator the trainer trains with
            rule = options.rule(check_gate(trainer))
            controller = KneeController(rule, audited[0] if audited else "otb")  # or the swap's
            self.gate = UpdateGate(trainer, controller, place)
        # The trainer-neutral core (live_core.py), its split under the trainer's own estimator
        # (when its settings make a registry one) and OTB; measured on the main process.
        self.core = LiveCore(
            audited,
            options.baselines,
            supported.aggregation or LOSS_AGGREGATION.get(loss_type, ""),
            level=options.metrics,
            record_dir=trainer.args.output_dir,
            dump_dir=dump_dir,
            place=place,
            controller=controller,
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

    @property
    def last(self) -> dict[str, float]:
        """The latest measured step's metrics, every one (main process)."""
        return self.core.last

    # -- hooks -------------------------------------------------------------------------------

    def generate(self, original: Callable[..., dict[str, Any]], inputs: Any) -> dict[str, Any]:
        with self.kl.generating() if self.kl is not None else contextlib.nullcontext():
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
        # On every process alike at a split step (under sharding the scoring is a collective)
        catch = live and self._pending.split and self.hidden is not None
        try:
            with self.hidden.catching(catch) if catch else contextlib.nullcontext([]) as hidden:
                loss = original(model, inputs)
        finally:
            captured, self._captured = self._captured, None
        if live:
            self.core.guard(self._pending.step, self._take, inputs, rows, captured, hidden)
        return self.gate.scale(loss) if self.gate is not None else loss

    def capture(self, output: Any) -> None:
        """Called by the fused forward: keep the loss forward's per-token fields."""
        if self._captured is not None and getattr(output, "log_sum_sq_probs", None) is not None:
            self._captured.append((output.log_probs.detach(), output.log_sum_sq_probs.detach()))

    def on_log(self, logs: dict[str, float], step: int) -> None:
        if "grad_norm" in logs:  # under the gate, an update's last batch only (update_gate.py)
            self.core.add_grad_norm(step, float(logs["grad_norm"]))

    # -- the work ----------------------------------------------------------------------------

    def _start(self, output: dict[str, Any]) -> None:
        step = self.trainer.state.global_step + 1  # the step this batch trains (TRL's log step)
        if (step - 1) % self.every:
            return
        # the swap's log p and Σπ² trained (a dump holds them), not the loss forward's
        from_loss = not (self.extra_forward or (self.swap and self.swap.needs_energy))
        p = self._pending = Pending.begin(self.trainer, step, output, from_loss)
        logged = (step - 1) // self.every  # this step's rank among the logged steps
        # a split step on every process alike, before anything that can fail on one alone
        p.split = self.split_every > 0 and logged % self.split_every == 0
        n, c = p.logprobs.shape
        penalty = self.kl.penalty(output["completion_mask"]) if self.kl is not None else None
        p.rewards = local_rewards(self.trainer, self.rewards_per_func, n, penalty)
        if p.split:
            p.scores = p.logprobs.new_zeros(n, c, self.split_k)

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
        c = p.logprobs.shape[1]  # the fused head scores positions 1..; keep the completion's
        logprobs = torch.cat([lp for lp, _ in captured])[:, -c:] if captured else None
        # Under sharding the scoring gathers the output layer: every process scores every
        # caught micro-step of a split step, also one whose own split has dropped.
        if hidden and (p.scores is not None or self.sharded):
            try:  # the split's scores from the loss's own forward (split_capture.py)
                scores = self.hidden.scores(
                    hidden, inputs["completion_ids"], self.trainer.temperature, self.split_k,
                    logprobs, inputs["completion_mask"],
                )  # fmt: skip
                if p.scores is not None:
                    p.scores[rows] = scores
            except Exception as e:  # noqa: BLE001  the split alone stops
                if p.scores is not None:
                    self._drop_split(p, describe(e))
        elif p.scores is not None and self.sharded:  # every process alike: no forward
            self._drop_split(p, f"the loss forward's hidden states were not caught ({NO_EXTRA})")
        elif p.scores is not None:
            p.scores = None  # no hidden states caught: one extra forward in `_local_rows`
        if logprobs is not None and p.from_loss:
            p.logprobs[rows] = logprobs.float()
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
        extra_split = p.split and p.scores is None and self.split_every > 0  # none caught
        if not p.from_loss or extra_split:
            own = step_batch(self.trainer, p.step, rows, grouped=False)  # the forward's input
            if not p.from_loss:  # those the advantages were computed from, else a forward
                sampled = self.swap.sampled_stats(own) if self.swap is not None else None
                if sampled is None and self.sharded:  # stopped here on every process alike
                    raise InputError(f"the loss forward gave no log Σπ² ({NO_EXTRA})")
                stats = sampled if sampled is not None else no_grad_stats(self.trainer, own)
                rows.logprobs, rows.sum_pi2 = stats
                own = step_batch(self.trainer, p.step, rows, grouped=False)
            if extra_split:
                try:
                    rows.scores = split_scores(policy(self.trainer), own, self.split_k)
                except Exception as e:  # noqa: BLE001  the split alone stops
                    self._drop_split(p, describe(e))
        return rows

    def _drop_split(self, p: Pending, what: str) -> None:
        """The split's scores failed at `p`'s step: said once, the split off, the rest on (the
        step stays a split step: `compute_loss` still catches, so the collectives match)."""
        split_dropped(p.step, what)
        self.split_every = 0
        p.scores = None

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


def attach(
    trainer: Any,
    every: int = DEFAULTS.every,
    dump_dir: str | Path | None = None,
    *,
    baselines: Sequence[str] | None = DEFAULTS.baselines,
    extra_forward: bool = False,
    split_every: int | None = DEFAULTS.split_every,
    split_k: int = DEFAULTS.split_k,
    advantages: str | None = None,
    advantage_options: Mapping[str, Any] | None = None,
    metrics: str = DEFAULTS.metrics,
    controller: str | None = DEFAULTS.controller,
    most_prompts: int | None = DEFAULTS.most_prompts,
) -> LiveDiagnostics:
    """Log OTB diagnostics under `otb/` at every `every`-th step of `trainer` (a constructed
    `trl.GRPOTrainer` or `trl.RLOOTrainer`); docs/live.md says what each key means.

    The live options (`every`, `split_every`, `split_k`, `baselines`, `metrics`, `controller`,
    `most_prompts`) are `core/options.py:LiveOptions`', with its defaults and checks: the
    within/between split and the knee pooled over its steps (`otb/split/...`,
    `otb/budget/<baseline>/<window|ema>/...`) at every 10th measured step, at most 20 `otb/`
    keys a step on the dashboard (`metrics="all"`: every one), and with `controller="knee"` the
    prompts of each optimizer update set from the pooled knee, realised by accumulating whole
    generation batches (`update_gate.py`). Whatever the level, the main process appends every
    metric of every measured step to `<output_dir>/otb_metrics.jsonl`, which `otb-diag
    dynamics` reads beside `trainer_state.json`. TRL's own options:

    dump_dir           write each measured step's batch there as exact-id rollouts (`dump.py`)
    extra_forward      take Σπ² and the split's hidden states from one extra no-grad forward each
                       instead of the loss's forward (what a TRL without the fused head's field
                       does; for the overhead benchmark)
    advantages         train with this registry baseline's token-level advantages in place of
                       the trainer's (`advantage_options` its options, e.g.
                       `{"handle_zero_tail": False}`), audited and dumped as the estimator that
                       ran (`advantages.py`)

    Under DDP, every step also logs the all-parameter two-batch estimate
    (`otb/split/params/...`, `ddp_noise.py`). With several processes (torchrun, accelerate
    launch), call it in every process, as the trainer is built in every process: the step's
    rows are gathered to the main process, which logs the metrics and writes the dump (its
    `dump_dir`; the others' is not used).

    Raises `InputError`, before anything is changed, for a trainer it does not take, a TRL
    whose trainer lacks a hook, a bad option (`LiveOptions.checked`), a trainer `attach` was
    already called on, what `support.py:check_trainer` refuses (the split under a `loss_type`
    it does not know or under FSDP1, an extra forward on a trainer that shards its
    parameters), a PEFT adapter its passes cannot run (`policy/causal_lm.py:causal_lm`), a dump
    directory that the main process cannot write, a baseline option it does not take,
    advantages a process cannot form from whole groups of its own or, under sharding, from
    generate's forwards (`advantages.py:check_swap`), or the controller on a trainer it cannot
    gate (`update_gate.py:check_gate`) or whose settings make its advantages no registry
    estimator (`support.py:Supported.audited`: the controller reads that estimator's knee).
    Warns when the trainer has already trained (the diagnostics start with its next `train()`).
    During training, an error of the diagnostics switches them off and the training goes on;
    one of the advantage swap stops it with one `advantages.py:AdvantageSwapError`."""
    supported = supported_trainer(trainer)
    if isinstance(getattr(trainer, LIVE_ATTRIBUTE, None), LiveDiagnostics):
        raise InputError(
            "attach() was already called on this trainer: a second call would measure every "
            "step twice.",
            hint="Call attach once, after building the trainer and before train(); the object "
            "the first call returned holds its settings.",
        )
    options = LiveOptions(
        every, split_every, split_k, baselines, metrics, controller, most_prompts
    ).checked()
    fused = fused_head()
    check_trainer(trainer, supported, options.split_every, extra_forward or fused is None)
    check_split_tokens(trainer, options.split_every)
    if options.controller is not None:
        check_gate(trainer)
    model = causal_lm(policy(trainer))  # a PEFT adapter the passes cannot run is refused here
    if options.split_every or advantages is not None:
        output_layer(model)  # the split's, or the swap's forward's: refused here, not mid-run
    record = check_advantages(advantages, advantage_options) if advantages is not None else None
    if options.controller is not None and record is None and supported.audited(trainer) is None:
        raise InputError(
            "controller='knee' reads the knee of the estimator the trainer trains with, and "
            f"this {type(trainer).__name__}'s settings ({supported.describe(trainer)}) make its "
            "advantages no registry estimator otb-diag knows.",
            hint="Train with one it knows (GRPOTrainer: scale_rewards 'group', 'none' or "
            "'batch' with multi_objective_aggregation='sum_then_normalize'; RLOOTrainer: "
            "normalize_advantages=False), or with attach(advantages=...), or attach without "
            "controller= for the diagnostics.",
        )
    if record is not None and supported is not SUPPORTED["GRPOTrainer"]:
        raise InputError(
            f"attach(advantages=...) trains a trl.GRPOTrainer with a registry baseline; got a "
            f"{type(trainer).__name__}.",
            hint="Use a GRPOTrainer (with loss_type and num_generations as you need), or attach "
            "without advantages= for the diagnostics alone.",
        )
    if record is not None:
        check_swap(trainer, record, supported.audited(trainer))
    folder = None if dump_dir is None else Path(dump_dir)
    if folder is not None and trainer.accelerator.is_main_process:  # the one that writes it
        folder = check_dump_dir(folder)
    live = LiveDiagnostics(trainer, supported, options, folder, extra_forward or fused is None)
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
    model = causal_lm(trainer.model)  # under PEFT, TRL patches the causal LM inside
    if live.split_every and not live.extra_forward:
        half = bool(trainer.args.bf16 or trainer.args.fp16)  # the head's precision, unless cast
        half &= not getattr(trainer.args, "cast_lm_head_to_fp32", False)
        live.hidden = HiddenCatch(model, sharded=live.sharded is not None, half=half)
    if fused is not None and not live.extra_forward:
        capture_fused(trainer, model, fused, live.capture)

    # First: its metrics are in when `_Live` logs; each step's at the dashboard's level.
    log = lambda m: log_to_trl(trainer, live.core.logged(m))  # noqa: E731
    live.params = install_ddp_noise(trainer, log, live.gate)
    gate = live.gate

    class _Live(TrainerCallback):
        def on_train_begin(self, args: Any, state: Any, control: Any, **_: Any) -> None:
            if gate is not None:
                gate.install()  # `train()` has built the optimizer, scheduler and wrapped model

        def on_step_end(self, args: Any, state: Any, control: Any, **_: Any) -> None:
            live.collect()
            if gate is not None:
                gate.step_end()  # after the step's decision was collected

        def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **_: Any) -> None:
            live.on_log(logs or {}, state.global_step)

    trainer.add_callback(_Live())
