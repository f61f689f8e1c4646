"""OTB diagnostics inside TRL's `GRPOTrainer` or `RLOOTrainer`: `attach(trainer)` and nothing else.

    trainer = GRPOTrainer(...)
    attach(trainer, dump_dir="otb-dumps")   # the one added line
    trainer.train()

Where the numbers come from (TRL 1.16, `trl/trainer/grpo_trainer.py`; `rloo_trainer.py` has
the same hooks):
- the batch: `_generate_and_score_completions` returns `prompt_ids`, `completion_ids`,
  `completion_mask` and `advantages` of the process's share of the generation batch; the
  rewards come from `_calculate_rewards` (every process's, weighted and summed as TRL sums them,
  sliced as TRL slices its `process_slice`). TRL then shuffles the rows and splits them over the
  gradient-accumulation micro-steps, so each row is tagged with its position (`otb_row`) to put
  the share back together.
- several processes: TRL hands process r the rows [r·n, (r+1)·n) of its generation batch, whose
  groups are consecutive blocks of `num_generations` rows, so a group can straddle two
  processes. Once a share is whole, every process hands it over (`gather_shares`) and the main
  process concatenates them in process order: the whole batch, whole groups, one computation,
  one log entry, one dump file, one step's rows in memory.
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
from otb_diag.integrations.ddp_noise import install_ddp_noise
from otb_diag.integrations.dump import check_dump_dir
from otb_diag.integrations.live_core import LiveCore
from otb_diag.integrations.metric_levels import check_level
from otb_diag.integrations.split_capture import HiddenCatch
from otb_diag.integrations.step_metrics import (
    PREFIX,
    check_whole_groups,
    round_off_clamped,
    split_scores,
)
from otb_diag.integrations.trl_advantages import AdvantageSwap, check_advantages, install_swap
from otb_diag.maths.estimators.registry import get_baseline, trainer_baseline
from otb_diag.maths.response_batch import ResponseBatch
from otb_diag.policy.forward_pass import checkpoint_stats

TESTED = ("1.16",)  # TRL minor versions whose GRPOTrainer and RLOOTrainer the tests run
HOOKS = ("_generate_and_score_completions", "_calculate_rewards", "_compute_loss")
# What `attach` reads of the batch `_generate_and_score_completions` returns.
OUTPUT_KEYS = ("prompt_ids", "prompt_mask", "completion_ids", "completion_mask", "advantages")
ROW_KEY = "otb_row"
LIVE_ATTRIBUTE = "otb_diagnostics"  # the trainer's attribute holding what `attach` installed
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


@dataclass(frozen=True)
class Supported:
    """A TRL trainer `attach` takes, and what differs between them."""

    registry: str  # `registry.trainer_baseline` name of the estimator its documentation gives
    documented: Mapping[str, Any]  # the settings under which its advantages are that estimator
    aggregation: str | None  # how its loss averages per-token terms; None: by its `loss_type`


# RLOOTrainer (TRL 1.16, `trl/trainer/rloo_trainer.py`): A_i = R_i − mean_{j≠i} R_j (the
# registry's `rloo`), unless its KL penalty (`beta`) shapes the rewards or it normalises the
# advantages; its loss is −min(ρ_i A_i, clip(ρ_i) A_i) averaged over sequences, ρ_i the ratio of
# the whole sequence (Σ_t log p), so its per-token terms are summed per sequence.
SUPPORTED = {
    "GRPOTrainer": Supported("trl", TRL_DEFAULTS, None),
    "RLOOTrainer": Supported(
        "trl-rloo", {"beta": 0.0, "normalize_advantages": False}, "seq-mean-token-sum"
    ),
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
    split: bool = False  # the within/between split at this step
    scores: Tensor | None = None  # [B, C, k] the split's scores from the loss's forward


@dataclass
class _Rows:
    """A step's rows on the CPU: one process's share (n rows, C its completion width), or every
    process's concatenated in process order, the order of TRL's generation batch."""

    prompt_ids: list[list[int]]  # n unpadded prompts
    completion_ids: Tensor  # [n, C]
    completion_mask: Tensor  # [n, C]
    tool_mask: Tensor  # [n, C] 1 on generated tokens (completion_mask times TRL's tool_mask)
    advantages: Tensor  # [n] the trainer's, or [n, C] token-level (`attach(advantages=...)`)
    rewards: Tensor  # [n]
    logprobs: Tensor  # [n, C'] (C' ≥ the longest response)
    sum_pi2: Tensor  # [n, C']
    scores: Tensor | None = None  # [n, T, k] the split's score vectors, on split steps


@dataclass
class _Share:
    """What one process hands over at a step's gather."""

    rows: _Rows | None  # None after an error on this process
    error: str | None  # the error that stopped this process's diagnostics
    dump_dir: Path | None  # the dump directory it was given (the main process writes the dump)


def gather_shares(share: _Share) -> list[_Share]:
    """Every process's share, in process order (accelerate's `gather_object`, that is
    `torch.distributed.all_gather_object`: pickled, any shapes); `[share]` with one process."""
    from accelerate.utils import gather_object

    return gather_object([share])


def _concat_rows(parts: Sequence[_Rows]) -> _Rows:
    """The processes' rows one after the other, each tensor right-padded with 0 to the widest."""

    def cat(tensors: list[Tensor]) -> Tensor:  # [n_r, C_r, ...] -> [Σ n_r, max C_r, ...]
        width = max(x.shape[1] for x in tensors)
        pads = [x.new_zeros(x.shape[0], width - x.shape[1], *x.shape[2:]) for x in tensors]
        return torch.cat([torch.cat([x, pad], 1) for x, pad in zip(tensors, pads, strict=True)])

    scores = [p.scores for p in parts]
    return _Rows(
        prompt_ids=[ids for p in parts for ids in p.prompt_ids],
        completion_ids=cat([p.completion_ids for p in parts]),
        completion_mask=cat([p.completion_mask for p in parts]),
        tool_mask=cat([p.tool_mask for p in parts]),
        advantages=(torch.cat if parts[0].advantages.ndim == 1 else cat)(
            [p.advantages for p in parts]  # [n] TRL's, [n, C] token-level ones (`advantages=`)
        ),
        rewards=torch.cat([p.rewards for p in parts]),
        logprobs=cat([p.logprobs for p in parts]),
        sum_pi2=cat([p.sum_pi2 for p in parts]),
        scores=None if any(x is None for x in scores) else cat(scores),  # type: ignore[misc]
    )


def rows_of(p: _Pending) -> _Rows:
    """The rows of one process's generation batch `p` as they stand (no forward run)."""
    x = p.inputs
    prompt_mask = x["prompt_mask"].bool().cpu()
    completion_mask = x["completion_mask"].cpu()
    tool = completion_mask * x["tool_mask"].cpu() if "tool_mask" in x else completion_mask
    return _Rows(
        prompt_ids=[
            ids[m].tolist() for ids, m in zip(x["prompt_ids"].cpu(), prompt_mask, strict=True)
        ],
        completion_ids=x["completion_ids"].cpu(),
        completion_mask=completion_mask,
        tool_mask=tool,
        advantages=x["advantages"].detach().cpu(),
        rewards=p.rewards,
        logprobs=p.logprobs,
        sum_pi2=p.sum_pi2,
    )


def _describe(error: Exception) -> str:
    return str(error) if isinstance(error, InputError) else f"{type(error).__name__}: {error}"


class LiveDiagnostics:
    """What `attach` installs on one trainer, in every process. It keeps one batch while the
    micro-steps train on it, the collapse watch's windows, the split pooled over the steps
    (`budget`: a fixed window of step tuples and moments) and the last step's metrics (`last`,
    main process), nothing per step: its memory is the same whatever the run's length, the
    numbers live in the trainer's log.

    With several processes each one collects its share of the step's rows; once the micro-steps
    have trained on all of them (the same micro-step in every process), every process hands its
    share over (`gather_shares`) and the main one computes, logs and dumps the whole step. A
    process whose diagnostics fail says so at once and hands the error over at the next gather,
    where every process stops together: one that stopped alone would leave the others waiting."""

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
        self.enabled = True
        self._processes = trainer.accelerator.num_processes
        self._main = trainer.accelerator.is_main_process
        self._error: str | None = None  # this process's error, not yet handed over
        self._dirs_checked = False
        self._pending: _Pending | None = None
        self._rewards: Tensor | None = None
        self._captured: list[tuple[Tensor, Tensor]] | None = None
        self.hidden: HiddenCatch | None = None  # the loss forward's hidden states (`_install`)
        self.params: Any = None  # the all-parameter estimate's callback (`_install`)
        self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="otb-diag")
        self._job: tuple[_Pending, Future] | None = None
        self.swap: AdvantageSwap | None = None  # `attach(advantages=...)`: trl_advantages.py
        documented = all(getattr(trainer, k, None) == v for k, v in supported.documented.items())
        loss_type = getattr(trainer, "loss_type", "")
        # The trainer-neutral core (live_core.py), its split under the trainer's own estimator
        # (when its settings are the documented ones) and OTB; measured on the main process.
        self.core = LiveCore(
            trainer_baseline(supported.registry) if documented else None,
            baselines,
            supported.aggregation or LOSS_AGGREGATION.get(loss_type, ""),
            level=level,
            record_dir=trainer.args.output_dir,
            dump_dir=dump_dir,
        )

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
        catch = live and self._pending.scores is not None and self.hidden is not None
        try:
            with self.hidden.catching(catch) if catch else contextlib.nullcontext([]) as hidden:
                loss = original(model, inputs)
        finally:
            captured, self._captured = self._captured, None
        if live:
            self._guard(self._pending.step, self._take, inputs, rows, captured, hidden)
        return loss

    def capture(self, output: Any) -> None:
        """Called by the fused forward: keep the loss forward's per-token fields."""
        if self._captured is not None and getattr(output, "log_sum_sq_probs", None) is not None:
            self._captured.append((output.log_probs.detach(), output.log_sum_sq_probs.detach()))

    def on_log(self, logs: dict[str, float], step: int) -> None:
        if "grad_norm" in logs:
            self.core.add_grad_norm(step, float(logs["grad_norm"]))

    # -- the work ----------------------------------------------------------------------------

    def _guard(self, step: int, fn: Callable[..., None], *args: Any) -> None:
        """Run `fn` (for step `step`); on any error, `_fail` (the training goes on untouched)."""
        try:
            fn(*args)
        except Exception as e:  # noqa: BLE001  the training must not die of a diagnostic
            self._fail(step, _describe(e))

    def _fail(self, step: int, what: str) -> None:
        """Say once that the diagnostics stop at `step`, and why. One process stops here;
        with several, this one hands `what` over at the next gather, where all stop."""
        if self._error is None:
            where = f" (process {self.trainer.accelerator.process_index})" * (self._processes > 1)
            warnings.warn(
                f"otb-diag live diagnostics switched off at step {step}{where}: {what}",
                RuntimeWarning,
                stacklevel=3,
            )
            self._error = what
        if self._processes == 1:
            self._switch_off()

    def _switch_off(self) -> None:
        self.enabled = False
        self._pending = None

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
        rows = self._local_rewards(n)
        logged = (step - 1) // self.every  # this step's rank among the logged steps
        split = self.split_every > 0 and logged % self.split_every == 0
        self._pending = _Pending(
            step=step,
            inputs={k: v for k, v in output.items() if isinstance(v, Tensor)},
            rewards=rows,
            logprobs=torch.zeros(n, c),
            sum_pi2=torch.zeros(n, c),
            seen=torch.zeros(n, dtype=torch.bool),
            # the swap's log p and Σπ² trained (a dump holds them), not the loss forward's
            from_loss=not (self.extra_forward or (self.swap and self.swap.needs_energy)),
            split=split,
            scores=torch.zeros(n, c, self.split_k) if split else None,
        )
        output[ROW_KEY] = torch.arange(n, device=output["completion_ids"].device)

    def _local_rewards(self, n: int) -> Tensor:
        """This process's rewards `[n]`, formed as TRL forms them: Σ_f weight_f · r_f, NaN
        rewards left out (`nansum`), NaN where every function returned None, clamped to
        RLOOTrainer's `reward_clip_range` where it has one."""
        assert self._rewards is not None, "TRL scored no completion"
        t = self.trainer
        start = t.accelerator.process_index * n  # TRL's `process_slice`
        per_func = self._rewards[start : start + n].float()  # [n, F]
        weights = t.reward_weights.to(per_func.device)[None, :]
        rewards = (per_func * weights).nansum(1)
        rewards[torch.isnan(per_func).all(1)] = torch.nan
        clip = getattr(t, "reward_clip_range", None)
        if clip:
            rewards = rewards.clamp(min=clip[0], max=clip[1])
        return rewards.detach().cpu()

    def _take(
        self, inputs: dict[str, Any], rows: Tensor, captured: list, hidden: list[Tensor]
    ) -> None:
        p = self._pending
        assert p is not None
        rows = rows.cpu()
        self._guard(p.step, self._keep, p, inputs, rows, captured, hidden)
        p.seen[rows] = True  # even after an error: this process still comes to the gather
        if self.enabled and bool(p.seen.all()):
            self._pending = None
            self._finish(p)

    def _keep(
        self, p: _Pending, inputs: dict[str, Any], rows: Tensor, captured: list, hidden: list
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
                    self._drop_split(p, _describe(e))
            else:
                p.scores = None  # no hidden states caught: one extra forward in `_local_rows`
        if captured and p.from_loss:
            c = p.logprobs.shape[1]  # the fused head scores positions 1..; keep the completion's
            p.logprobs[rows] = torch.cat([lp for lp, _ in captured])[:, -c:].float().cpu()
            p.sum_pi2[rows] = torch.cat([lq for _, lq in captured])[:, -c:].float().exp().cpu()
        else:
            p.from_loss = False  # this forward was not the fused one: one extra forward

    def _finish(self, p: _Pending) -> None:
        """Every process, at the micro-step that trained the last of its rows (before that
        micro-step's backward pass): its share handed over; the main process measures."""
        rows = None
        if self._error is None:
            try:
                rows = self._local_rows(p)
            except Exception as e:  # noqa: BLE001  an extra forward can fail on one process
                self._fail(p.step, _describe(e))
        try:
            shares = gather_shares(_Share(rows, self._error, self.dump_dir))
        except Exception as e:  # noqa: BLE001  no agreement is possible without the group
            self._fail(p.step, f"the step's rows could not be gathered ({_describe(e)})")
            self._switch_off()
            return
        if any(s.error is not None for s in shares):
            self._switch_off()  # every process, together (the failing one has said why)
            return
        if p.split and any(s.rows is not None and s.rows.scores is None for s in shares):
            self.split_every = 0  # a process dropped the split (it has said why): all drop it
        if self._main:
            self._guard(p.step, self._submit, p, shares)

    def _local_rows(self, p: _Pending) -> _Rows:
        """This process's rows of `p`, with log p and Σπ² from one extra forward where the
        loss's forward gave none, and the split's scores on split steps. The scores need the
        weights that sampled the batch: before the optimizer step, here."""
        rows = rows_of(p)
        rows.scores = p.scores  # caught from the loss's forward, or None
        extra_split = p.split and p.scores is None
        if not p.from_loss or extra_split:
            own = self._batch(p.step, rows, grouped=False)  # the forward's input
            if not p.from_loss:
                rows.logprobs, rows.sum_pi2 = self._forward_stats(own)
                own = self._batch(p.step, rows, grouped=False)
            if extra_split:
                try:
                    rows.scores = split_scores(self._policy(), own, self.split_k)
                except Exception as e:  # noqa: BLE001  the split alone stops
                    self._drop_split(p, _describe(e))
        return rows

    def _drop_split(self, p: _Pending, what: str) -> None:
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

    def _submit(self, p: _Pending, shares: list[_Share]) -> None:
        """The main process: the step's batch from every process's rows, its tables computed
        beside the backward pass and the optimizer step (torch's kernels release the GIL);
        `collect`, at the step's end, logs them before TRL does."""
        self._check_dump_dirs(shares)
        rows = _concat_rows([s.rows for s in shares if s.rows is not None])
        batch = self._batch(p.step, rows)
        check_whole_groups(batch, f"TRL step {p.step}")
        scores = rows.scores
        if scores is not None:  # zero past each response (the caught ones span the completion)
            scores = scores[:, : batch.valid.shape[1]] * batch.valid[..., None]
        self._job = (p, self._worker.submit(self.core.measure, batch, p.step, scores))

    def _check_dump_dirs(self, shares: list[_Share]) -> None:
        """Warn once where another process was given a dump directory that is not the main
        process's: the main process writes every process's rows, to its own `dump_dir`."""
        if self._dirs_checked:
            return
        self._dirs_checked = True
        other = {
            i: s.dump_dir
            for i, s in enumerate(shares)
            if s.dump_dir is not None and s.dump_dir != self.dump_dir
        }
        if other:
            given = ", ".join(f"process {i}: {d}" for i, d in other.items())
            main = self.dump_dir or "none, so nothing is dumped"
            warnings.warn(
                f"otb-diag: the main process writes the dump of every process's rows, to its "
                f"own dump_dir ({main}); the dump_dir given elsewhere ({given}) is not used.",
                RuntimeWarning,
                stacklevel=4,
            )

    def collect(self) -> None:
        """Log the step's metrics (the trainer's `on_step_end`, before its `log`)."""
        if self._job is not None:
            p, job = self._job
            self._job = None
            self._guard(p.step, self._log, p, job)

    def _log(self, p: _Pending, job: Future) -> None:
        metrics = job.result()  # the worker's error, if any, is raised here
        metrics[f"{PREFIX}sum_pi2_from_loss_logits"] = float(p.from_loss)
        # The all-parameter estimate joins the pools on the split's steps, which log the step's
        # P, N and L̄ (`dynamics` reading the log back pools the same rows).
        params = self.params.last if self.params is not None else {}
        metrics = self.core.finish(p.step, metrics, params)
        logged = self.trainer._metrics["train"]
        for name, value in self.core.logged(metrics).items():
            if math.isfinite(value):  # an undefined z or ratio is left out, not logged as NaN
                logged[name].append(value)

    def _batch(self, step: int, rows: _Rows, *, grouped: bool = True) -> ResponseBatch:
        """The `ResponseBatch` of `rows`: the step's, its groups the consecutive blocks of
        `num_generations` rows of TRL's generation batch; or (`grouped=False`) one process's
        share as one group, the input of a forward pass over it."""
        t = self.trainer
        n, c = rows.completion_ids.shape
        generations = t.num_generations if grouped else max(n, 1)
        prompts = rows.prompt_ids
        if grouped and (
            n % generations or any(prompts[i] != prompts[i - i % generations] for i in range(n))
        ):
            raise InputError(
                f"the step's groups are not whole: its {n} rows, gathered from "
                f"{self._processes} process(es), are not blocks of num_generations={generations} "
                "completions of one prompt each.",
                hint="TRL's sampler repeats each prompt num_generations times in a row; a "
                "sampler or data collator that reorders the batch breaks its groups.",
            )
        # A response runs to its last completion token (mask 1); a truncated one that TRL
        # masked out entirely (`mask_truncated_completions`) to the full width.
        positions = torch.arange(c)
        last = torch.where(rows.completion_mask.bool(), positions, -1).amax(-1)
        length = torch.where(last >= 0, last + 1, c)
        return ResponseBatch.from_padded(
            group_names=[f"s{step}-g{k}" for k in range(n // generations)],
            group=torch.arange(n) // generations,
            prompt_ids=prompts,
            response_ids=rows.completion_ids,
            length=length,
            tool_mask=rows.tool_mask,
            **round_off_clamped(rows.logprobs, rows.sum_pi2),
            temperature=t.temperature,
            step=step,
            reward=rows.rewards,
            trainer_advantage=rows.advantages,
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
    (`otb/budget/<baseline>/<window|ema>/...`, `maths/variance/budget_stream.py`): the pooled
    noise scale and its interval, the SNR at the run's P, the within share, the tokens a step
    at the knee. Under DDP, every step also logs the all-parameter two-batch estimate
    (`otb/split/params/...`, `ddp_noise.py`). `advantages="otb"` (any registry baseline,
    `advantage_options` its options, e.g. `{"handle_zero_tail": False}`) trains with that
    baseline's token-level advantages in place of the trainer's, audited and dumped as the
    estimator that ran (`trl_advantages.py`; each process's groups must be whole).

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

    supported = _supported(trainer)
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
    sharding = _sharding(trainer)
    if split_every and sharding is not None:
        raise InputError(
            f"the within/between split recomputes the logits from the output layer's weight "
            f"outside the forward pass, where {sharding} holds only a shard of it on each "
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
    fused = _fused_head()
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


def _supported(trainer: Any) -> Supported:
    """What `attach` knows of `trainer`'s class; an `InputError` for one it cannot hook."""
    import trl

    kinds = [name for name in SUPPORTED if getattr(trl, name, None) is not None]
    name = next((k for k in kinds if isinstance(trainer, getattr(trl, k))), None)
    if name is None:
        raise InputError(
            f"attach() takes a trl.{' or trl.'.join(kinds)}; got a {type(trainer).__name__}.",
            hint="Construct the trainer first, then call attach(trainer) before train().",
        )
    missing = [h for h in HOOKS if not callable(getattr(trainer, h, None))]
    if missing:
        raise InputError(
            f"TRL {trl.__version__}'s {name} has no {', '.join(missing)}, the hook(s) "
            f"attach() uses; it is tested with TRL {', '.join(TESTED)}.",
            hint="Install a tested TRL (pip install 'trl==1.16.*'), or dump the batches "
            "yourself and run otb-diag energy on them.",
        )
    return SUPPORTED[name]


def _sharding(trainer: Any) -> str | None:
    """ "FSDP" or "DeepSpeed ZeRO-3" when `trainer` shards its parameters over the processes
    (read off its accelerator's plugins, set before `train()` wraps the model), else None."""
    if getattr(trainer, "is_fsdp_enabled", False):
        return "FSDP"
    plugin = getattr(trainer.accelerator.state, "deepspeed_plugin", None)
    if plugin is not None and getattr(plugin, "zero_stage", None) == 3:
        return "DeepSpeed ZeRO-3"
    return None


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

    live.params = install_ddp_noise(trainer)  # first: its metrics are in when `_Live` logs

    class _Live(TrainerCallback):
        def on_step_end(self, args: Any, state: Any, control: Any, **_: Any) -> None:
            live.collect()

        def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **_: Any) -> None:
            live.on_log(logs or {}, state.global_step)

    trainer.add_callback(_Live())
