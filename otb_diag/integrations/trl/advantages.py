"""Train with a registry baseline in TRL's `GRPOTrainer`: `attach(trainer, advantages="otb")`.

    trainer = GRPOTrainer(...)
    attach(trainer, advantages="otb", dump_dir="otb-dumps")   # train with OTB, audit it
    trainer.train()

TRL 1.16 computes one advantage per response in `_generate_and_score_completions` and its
`_compute_loss` takes `advantages` of shape `[B]` or `[B, T]` ("to support subclasses"). The
swap wraps that generation (inside the live diagnostics' own wrapper, which then sees, logs,
audits and dumps the advantages that train) and replaces the batch's `advantages` by the
registry baseline's, token level, `[B, C]` on the completion's width, before TRL shuffles the
rows and splits them over the micro-steps:

    A_t = (G_t − B_t) · mask_t        (maths/estimators/advantages.py:batch_advantages)

from the rewards TRL formed (`rows.py:local_rewards`: Σ_f weight_f · r_f), TRL's
groups (consecutive blocks of `num_generations` rows) and, for a baseline that needs the
realized energy (`otb`, `optseq`, …), `W_t = Σ_{j≤t} mask_j w_j` with
`w_t = (1 − 2 p_t + Σπ²_t)/τ²` of the sampling policy (the model as it generated the batch):
its `log p` and `Σπ²` are caught from the forwards `generate` ran to sample the batch
(`generation_stats.py:GenerationStats`: no pass beyond TRL's own), or, where TRL did not
generate with transformers' `generate` in one call (vLLM, continuous batching, a rollout
function, tool turns, beam search), from one no-grad forward of the policy
(`rows.py:no_grad_stats`, `policy/forward_pass.py:checkpoint_stats`);
`otb/advantages/extra_forward` says which (0 or 1).
TRL's own forward for old log-probabilities (run only when generation and optimisation steps
are misaligned) gives no Σπ², so it is not reused. The diagnostics then take their `log p` and
`Σπ²` from the same place (not from the loss's forward), so a dumped step holds exactly the
numbers its advantages were computed from, and `otb-diag energy --model-free` recomputes them
to the last bit.

Under DeepSpeed ZeRO-3 or FSDP (`support.py:sharding`) every forward is a collective, so that
no-grad forward of one process's own rows is never taken. transformers runs `generate` there
under `synced_gpus` (each process's statistics cut at its own last token, `generation_stats.py`);
`attach` refuses the settings by which TRL does not generate with one `generate` call
(`support.py:generated_elsewhere`), and at each step the processes agree, before anything else
of the swap, whether every one caught its rows' statistics, stopping together with the reason
where one has not (`AdvantageSwap._caught`), never leaving one process in a forward the others
do not run.

The estimator TRL's own settings make (`support.py:grpo_estimator`: `grpo` with ε = 1e-4 under
its default `scale_rewards="group"`), named as the one to train with, is TRL's own tensor: it is
left as TRL computed it (the audit checks it every step). The registry's float32 sums differ
from TRL's in the last bit for some reward patterns (mean of squares times n/(n − 1) against a
sum over n − 1), which would move the weights by round-off; leaving it makes
`advantages="grpo"` train bit for bit as TRL alone.

The diagnostics switch themselves off on an error and the training goes on; the swap cannot (the
step has no advantages without it). What `attach` can know is refused there, before anything
changes; an error of the swap during training is raised as one `AdvantageSwapError` whose message
names the run's configuration (`configuration`) and what to do, chained to the original, so the
user's traceback ends in one readable paragraph (issue 52).
"""

from __future__ import annotations

import importlib.metadata
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from otb_diag.errors import InputError
from otb_diag.integrations.core.generation_stats import GenerationStats
from otb_diag.integrations.trl.rows import (
    Pending,
    local_rewards,
    no_grad_stats,
    policy,
    rows_of,
    step_batch,
)
from otb_diag.integrations.trl.support import generated_elsewhere, sharding
from otb_diag.maths.energy.token_stats import logged_stats
from otb_diag.maths.estimators.advantages import Estimator, batch_advantages
from otb_diag.maths.estimators.registry import baseline_names, get_baseline
from otb_diag.maths.response_batch import ResponseBatch

if TYPE_CHECKING:
    from otb_diag.integrations.trl.adapter import LiveDiagnostics

EXTRA_FORWARD = "otb/advantages/extra_forward"  # 1: W took a no-grad forward; 0: generate's
# The `GRPOConfig` settings an `AdvantageSwapError` names, beside TRL's version, the adapter,
# the precision and the processes (`configuration`).
NAMED_SETTINGS = (
    "loss_type", "scale_rewards", "num_generations", "num_iterations", "beta",
    "importance_sampling_level", "multi_objective_aggregation", "use_vllm",
)  # fmt: skip


class AdvantageSwapError(RuntimeError):
    """The advantage swap failed during training: one paragraph naming the configuration and
    what to do (`AdvantageSwap.generate`), raised from the original error."""


def _estimator_record(name: str, options: Mapping[str, Any] | None) -> tuple[str, dict[str, Any]]:
    """(registry name, options) of the estimator `advantages=name` runs in TRL: the options
    the trainer documents for it (`grpo`: ε = 1e-4), then `options`; the zero-tail choice is
    written out for a baseline that takes it, so an audit reads what ran whatever its own
    default. An `InputError` for an unknown name or an option the baseline does not take."""
    entry = get_baseline(name)  # raises, listing the known names
    given = dict(options or {})
    takes = sorted(entry.options - {"is_weights"})
    unknown = [k for k in given if k not in takes]
    if unknown:
        raise InputError(
            f"baseline '{name}' takes no option {', '.join(map(repr, unknown))}; it takes "
            f"{', '.join(takes) or 'none'}.",
            field="advantage_options",
        )
    record = {"handle_zero_tail": True, **entry.trainers.get("trl", {}), **given}
    return name, {k: v for k, v in record.items() if k in entry.options}


class AdvantageSwap:
    """What `attach(trainer, advantages=...)` installs: the registry estimator `record`
    (`_estimator_record`) in place of TRL's advantages, on every training generation."""

    def __init__(
        self, trainer: Any, live: LiveDiagnostics, record: tuple[str, dict[str, Any]]
    ) -> None:
        self.trainer = trainer
        self.live = live
        self.name, self.options = record
        # The estimator TRL's settings already make: its own tensor trains (module docstring)
        self.passthrough = record == live.audited
        self.needs_energy = get_baseline(self.name).needs_energy
        self._sampled: tuple[int, Tensor, Tensor] | None = None  # step, log p, Σπ² [B, T]
        self.took_forward = 0.0  # 1.0 when the latest batch's W took a no-grad forward
        self.caught = (  # log p and Σπ² of generate's own forwards
            GenerationStats(policy(trainer), trainer.temperature)
            if self.needs_energy and not self.passthrough
            else None
        )

    def generate(self, original: Callable[..., dict[str, Any]], inputs: Any) -> dict[str, Any]:
        """TRL's generation, its `advantages` replaced by the registry's (training only); an
        error of the swap (not TRL's own) becomes one `AdvantageSwapError`."""
        output = original(inputs)
        if self.trainer.model.training and not self.passthrough:
            try:
                output["advantages"] = self.advantages(output)
            except Exception as e:
                raise AdvantageSwapError(self._failure(e)) from e
        return output

    def _failure(self, error: Exception) -> str:
        """The paragraph of an `AdvantageSwapError`: what failed, under which configuration,
        and what to do (an `InputError`: its own reason and hint; anything else: a bug)."""
        step = self.trainer.state.global_step + 1
        what = str(error) if isinstance(error, InputError) else f"{type(error).__name__}: {error}"
        what = what.rstrip(".")  # the paragraph's own full stop follows
        head = (
            f"otb-diag: attach(advantages={self.name!r}, advantage_options={self.options}) could "
            f"not form step {step}'s advantages, so the training stops: {what}. Configuration: "
            f"{configuration(self.trainer)}."
        )
        if isinstance(error, InputError):
            return head
        return (
            f"{head} This is otb-diag's fault, not yours: please report it on otb-diag's issue "
            "tracker with this paragraph and the traceback above it. Meanwhile attach(trainer) "
            "without advantages= trains with TRL's own advantages, with the diagnostics on."
        )

    def advantages(self, output: dict[str, Any]) -> Tensor:
        """`[B, C]` float32 advantages of the generated batch `output` (TRL's dict)."""
        step = self.trainer.state.global_step + 1
        n, c = output["completion_ids"].shape
        caught = self._caught(n, c) if self.needs_energy else None  # first: agreed if sharded
        zeros = torch.zeros(n, c)
        pending = Pending(
            step=step,
            inputs={k: v for k, v in output.items() if isinstance(v, Tensor)},
            rewards=self._rewards(n),
            logprobs=zeros,
            sum_pi2=zeros,
            seen=torch.ones(n, dtype=torch.bool),  # the whole batch, as generated
        )
        rows = rows_of(pending)
        batch = step_batch(self.trainer, step, rows)  # this process's groups, whole
        if self.needs_energy:
            if caught is not None:
                rows.logprobs, rows.sum_pi2 = caught
            else:  # not generated in one `generate` call (unsharded): one more forward
                rows.logprobs, rows.sum_pi2 = no_grad_stats(self.trainer, batch)
            batch = step_batch(self.trainer, step, rows)  # clamped as a dump reads back
            self._sampled = (step, batch.logprobs, batch.sum_pi2)
            self.took_forward = float(caught is None)  # logged with the step (`_log`)
        estimator = Estimator(options=self.options)
        found = batch_advantages(batch, self._w(batch), [self.name], estimator)
        registry = found.by_baseline[self.name]  # [B, T]: A_t = (G_t − B_t)·mask_t
        advantages = torch.zeros(n, c)
        advantages[:, : registry.shape[1]] = registry  # 0 on the padding beyond the longest
        return advantages.to(output["advantages"].device)

    def _caught(self, n: int, c: int) -> tuple[Tensor, Tensor] | None:
        """`(log p, Σπ²)` `[n, c]` of this process's batch from its latest `generate` call, or
        None where that call did not generate these n rows whole (the caller then takes one
        no-grad forward). Under sharding that forward would be a collective of this process
        alone: the processes agree whether each caught its rows (one `all_gather` of a flag,
        before anything here can fail on one process alone) and stop together, with the
        reason, where one did not."""
        taken = self.caught.taken() if self.caught is not None else None
        fits = taken is not None and taken[0].shape[0] == n and taken[0].shape[1] >= c
        sharded = self.live.sharded
        if sharded is not None:
            missing = [r for r, ok in enumerate(self.live.core.place.all_gather(fits)) if not ok]
            if missing:
                raise InputError(
                    f"under {sharded} otb-diag reads the energy of the advantages from the "
                    "forwards of transformers' generate, and process(es) "
                    f"{', '.join(map(str, missing))} did not generate their {n} rows in one "
                    "generate call; the no-grad forward that replaces it elsewhere is a "
                    "collective those processes would run alone, so every process stops here.",
                    hint="Attach without advantages= (TRL's advantages, the diagnostics on), or "
                    "generate with transformers' generate under sharding (no vLLM, continuous "
                    "batching, rollout_func, tools or beam search).",
                )
        return (taken[0][:, :c], taken[1][:, :c]) if fits and taken is not None else None

    def _rewards(self, n: int) -> Tensor:
        """This process's `[n]` rewards as TRL formed them; an unscorable completion (every
        reward function returned None: TRL gives it advantage 0, outside its group's
        statistics) has no place in a group baseline, so it stops the run with its reason."""
        rewards = local_rewards(self.trainer, self.live.rewards_per_func, n)
        if bool(torch.isnan(rewards).any()):
            raise InputError(
                f"step {self.trainer.state.global_step + 1}: a completion has no reward (every "
                f"reward function returned None); baseline '{self.name}' needs every reward of "
                "a group.",
                hint="Make every reward function score every completion.",
            )
        return rewards

    def _w(self, batch: ResponseBatch) -> Tensor:
        """`[B, T]` per-token energy `w` (zeros for a baseline that needs none)."""
        return logged_stats(batch).w if self.needs_energy else torch.zeros_like(batch.mask)

    def sampled_stats(self, batch: ResponseBatch) -> tuple[Tensor, Tensor] | None:
        """The `log p`, `Σπ²` (`[B, T]`) this swap computed the advantages of `batch`'s step
        from, for the diagnostics to log and dump; None when it computed none for that step."""
        if self._sampled is None or self._sampled[0] != batch.step[0]:
            return None
        return self._sampled[1], self._sampled[2]


def configuration(trainer: Any) -> str:
    """What an error report needs of the run: TRL's version and trainer, the settings of
    `NAMED_SETTINGS` it has, the PEFT adapter, the precision and the processes."""
    args = trainer.args
    settings = [
        f"{name}={getattr(trainer, name, getattr(args, name, None))!r}"
        for name in NAMED_SETTINGS
        if hasattr(trainer, name) or hasattr(args, name)
    ]
    peft = getattr(policy(trainer), "peft_config", None)
    adapter = ", ".join(_value(c.peft_type) for c in peft.values()) if peft else "none"
    precision = "bf16" if args.bf16 else "fp16" if args.fp16 else "fp32"
    accelerator = trainer.accelerator
    return (
        f"TRL {importlib.metadata.version('trl')} {type(trainer).__name__}, "
        f"{', '.join(settings)}, peft={adapter}, precision={precision}, "
        f"processes={accelerator.num_processes} "
        f"(distributed_type={_value(accelerator.distributed_type)})"
    )


def _value(member: Any) -> str:
    """An enum member's value (`PeftType.LORA` → "LORA"), anything else as text."""
    return str(getattr(member, "value", member))


def check_advantages(name: Any, options: Any) -> tuple[str, dict[str, Any]]:
    """`attach`'s `advantages` and `advantage_options` as an estimator record, or an
    `InputError` (before anything is installed)."""
    if not isinstance(name, str):
        raise InputError(
            f"advantages must be a registry baseline's name; got {name!r}.",
            hint=f"Known baselines: {', '.join(baseline_names())}.",
        )
    if options is not None and not isinstance(options, Mapping):
        raise InputError(f"advantage_options must be a mapping; got {options!r}.")
    return _estimator_record(name, options)


def check_swap(
    trainer: Any, record: tuple[str, dict[str, Any]], audited: tuple[str, dict[str, Any]] | None
) -> None:
    """What the swap of `record` cannot run on `trainer` (a GRPOTrainer whose own estimator is
    `audited`), refused at `attach` before anything is installed: a process's generation batch
    that is not whole groups (the swap forms each process's advantages from its own groups),
    and under sharding a baseline that needs the energy where TRL does not generate with one
    `generate` call (`support.py:generated_elsewhere`; `AdvantageSwap._caught`)."""
    if record == audited:  # TRL's own tensor trains (`AdvantageSwap.passthrough`): no swap
        return
    args, name = trainer.args, record[0]
    share = args.per_device_train_batch_size * args.steps_per_generation  # a process's rows
    if share % trainer.num_generations:
        raise InputError(
            f"attach(advantages={name!r}) forms each process's advantages from its own groups, "
            f"and each process generates {share} completions a batch "
            f"(per_device_train_batch_size={args.per_device_train_batch_size} × "
            f"steps_per_generation={args.steps_per_generation}), not whole groups of "
            f"num_generations={trainer.num_generations}: a group would straddle two processes.",
            hint="Make per_device_train_batch_size × steps_per_generation a multiple of "
            "num_generations, or attach without advantages= (TRL's advantages, the diagnostics "
            "on).",
        )
    sharded, elsewhere = sharding(trainer), generated_elsewhere(trainer)
    if sharded is not None and elsewhere is not None and get_baseline(name).needs_energy:
        raise InputError(
            f"baseline '{name}' needs each token's energy before the loss forward, which "
            "otb-diag reads from the forwards of transformers' generate; with "
            f"{elsewhere} TRL does not generate a process's rows in one generate call, and "
            f"under {sharded} the no-grad forward that would replace it is a collective each "
            "process would run on its own rows alone: it would hang the training.",
            hint="Under sharding, train with it where TRL generates with transformers' "
            "generate, or attach without advantages= (TRL's advantages, the diagnostics on), "
            "or with a baseline that needs no energy ('rloo', 'mean', ...).",
        )


def install_swap(trainer: Any, live: LiveDiagnostics, record: tuple[str, dict[str, Any]]) -> None:
    """Wrap the trainer's generation on the instance with an `AdvantageSwap` (before the live
    diagnostics wrap it, so that they see the advantages that train) and make `record` the
    estimator the diagnostics audit, dump and split the step's noise under."""
    swap = AdvantageSwap(trainer, live, record)
    generate = trainer._generate_and_score_completions
    trainer._generate_and_score_completions = lambda inputs: swap.generate(generate, inputs)
    live.core.trains_with(record)
    live.swap = swap
