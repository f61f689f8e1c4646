"""A TRL step's rows: put back together from the micro-steps that train on them, concatenated
once every process has handed its share over, and made the step's `ResponseBatch`.

TRL's `_generate_and_score_completions` returns `prompt_ids`, `completion_ids`,
`completion_mask` and `advantages` of the process's share of the generation batch; the rewards
come from `_calculate_rewards` (every process's, weighted and summed as TRL sums them, sliced as
TRL slices its `process_slice`). TRL then shuffles the rows and splits them over the
gradient-accumulation micro-steps, so each row is tagged with its position (`ROW_KEY`) to put the
share back together (`Pending`). TRL hands process r the rows [r·n, (r+1)·n) of its generation
batch, whose groups are consecutive blocks of `num_generations` rows, so a group can straddle two
processes: once a share is whole, every process hands it over (`live_core.py:LiveCore.gather`)
and the main process concatenates them in process order (`concat_rows`): the whole batch, whole
groups."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from otb_diag.errors import InputError
from otb_diag.integrations.core.step_metrics import round_off_clamped
from otb_diag.integrations.trl.support import TESTED
from otb_diag.maths.response_batch import ResponseBatch
from otb_diag.policy.forward_pass import checkpoint_stats

# What `attach` reads of the batch `_generate_and_score_completions` returns.
OUTPUT_KEYS = ("prompt_ids", "prompt_mask", "completion_ids", "completion_mask", "advantages")
ROW_KEY = "otb_row"


@dataclass
class Pending:
    """One generation batch being put back together from the micro-steps that train on it."""

    step: int
    inputs: dict[str, Any]  # the batch as `_generate_and_score_completions` returned it
    rewards: Tensor  # [B] (CPU)
    logprobs: Tensor  # [B, C] from the loss's forward (filled row by row, on the batch's device)
    sum_pi2: Tensor  # [B, C] (the batch's device)
    seen: Tensor  # [B] bool (the batch's device)
    taken: int = 0  # rows the micro-steps have trained so far
    from_loss: bool = True
    split: bool = False  # the within/between split at this step
    scores: Tensor | None = None  # [B, C, k] the split's scores from the loss's forward

    @classmethod
    def begin(cls, trainer: Any, step: int, output: dict[str, Any], from_loss: bool) -> Pending:
        """The batch TRL's `_generate_and_score_completions` returned (`output`) at `step`,
        pending, its rows tagged (`ROW_KEY`); its rewards not yet read (NaN). It is made pending
        and tagged before anything that can fail on one process alone (its rewards, its split's
        memory): failing there, this process still counts its rows through the micro-steps and
        hands its error over at the step's gather, where the other processes wait for its share.
        What the micro-steps fill stays on the batch's device until the share is whole: one read
        to the host a step, not one a micro-step (a read waits for the device, and the
        trainer's next launches with it)."""
        missing = [k for k in OUTPUT_KEYS if k not in output]
        if missing:
            raise InputError(
                f"{type(trainer).__name__}._generate_and_score_completions returned no "
                f"{', '.join(missing)}: this TRL is not one attach() can read (tested with TRL "
                f"{', '.join(TESTED)}).",
                hint="Install a tested TRL (pip install 'trl==1.16.*').",
            )
        n, c = output["completion_ids"].shape
        device = output["completion_ids"].device
        pending = cls(
            step=step,
            inputs={k: v for k, v in output.items() if isinstance(v, Tensor)},
            rewards=torch.full((n,), torch.nan),
            logprobs=torch.zeros(n, c, device=device),
            sum_pi2=torch.zeros(n, c, device=device),
            seen=torch.zeros(n, dtype=torch.bool, device=device),
            from_loss=from_loss,
        )
        output[ROW_KEY] = torch.arange(n, device=device)
        return pending


@dataclass
class Rows:
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


def concat_rows(parts: Sequence[Rows]) -> Rows:
    """The processes' rows one after the other, each tensor right-padded with 0 to the widest."""

    def cat(tensors: list[Tensor]) -> Tensor:  # [n_r, C_r, ...] -> [Σ n_r, max C_r, ...]
        width = max(x.shape[1] for x in tensors)
        pads = [x.new_zeros(x.shape[0], width - x.shape[1], *x.shape[2:]) for x in tensors]
        return torch.cat([torch.cat([x, pad], 1) for x, pad in zip(tensors, pads, strict=True)])

    scores = [p.scores for p in parts]
    return Rows(
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


def rows_of(p: Pending) -> Rows:
    """The rows of one process's generation batch `p` as they stand (no forward run), on the
    CPU: the step's one read to the host. An `InputError` where the micro-steps trained some
    row twice and another never (their count said the share was whole)."""
    if not bool(p.seen.all()):
        raise InputError(
            f"step {p.step}: TRL's micro-steps trained {p.taken} rows of this process's "
            f"{len(p.seen)} but not every one of them once; attach() reads a step's rows from "
            "the micro-steps of its first iteration.",
            hint="Report it with your TRL version and GRPOConfig: a sampler that repeats rows "
            "within one iteration breaks this count.",
        )
    x = p.inputs
    kept = x["prompt_mask"].bool().cpu()  # [n, L]
    flat, lengths = x["prompt_ids"].cpu()[kept].tolist(), kept.sum(-1).tolist()  # row-major
    starts = itertools.accumulate(lengths, initial=0)
    completion_mask = x["completion_mask"].cpu()
    tool = completion_mask * x["tool_mask"].cpu() if "tool_mask" in x else completion_mask
    return Rows(
        prompt_ids=[flat[s : s + n] for s, n in zip(starts, lengths, strict=False)],
        completion_ids=x["completion_ids"].cpu(),
        completion_mask=completion_mask,
        tool_mask=tool,
        advantages=x["advantages"].detach().cpu(),
        rewards=p.rewards,
        logprobs=p.logprobs.cpu(),
        sum_pi2=p.sum_pi2.cpu(),
    )


def local_rewards(
    t: Any, rewards_per_func: Tensor | None, n: int, penalty: Tensor | None = None
) -> Tensor:
    """This process's rewards `[n]` of trainer `t`, from every process's `rewards_per_func`
    `[B_all, F]` (TRL's `_calculate_rewards`) formed as TRL forms them: Σ_f weight_f · r_f, NaN
    rewards left out (`nansum`), NaN where every function returned None, clamped to
    RLOOTrainer's `reward_clip_range` where it has one, less its KL `penalty` `[n]` where it
    has one (`kl_penalty.py`: `R − β·KL`)."""
    assert rewards_per_func is not None, "TRL scored no completion"
    start = t.accelerator.process_index * n  # TRL's `process_slice`
    per_func = rewards_per_func[start : start + n].float()  # [n, F]
    weights = t.reward_weights.to(per_func.device)[None, :]
    rewards = (per_func * weights).nansum(1)
    rewards[torch.isnan(per_func).all(1)] = torch.nan
    clip = getattr(t, "reward_clip_range", None)
    if clip:
        rewards = rewards.clamp(min=clip[0], max=clip[1])
    if penalty is not None:
        rewards = rewards - penalty.to(rewards.device)
    return rewards.detach().cpu()


def step_batch(t: Any, step: int, rows: Rows, *, grouped: bool = True) -> ResponseBatch:
    """The `ResponseBatch` of `rows` of trainer `t`: the step's, its groups the consecutive
    blocks of `num_generations` rows of TRL's generation batch; or (`grouped=False`) one
    process's share as one group, the input of a forward pass over it."""
    n, c = rows.completion_ids.shape
    generations = t.num_generations if grouped else max(n, 1)
    prompts = rows.prompt_ids
    if grouped and (
        n % generations or any(prompts[i] != prompts[i - i % generations] for i in range(n))
    ):
        raise InputError(
            f"the step's groups are not whole: its {n} rows, gathered from "
            f"{t.accelerator.num_processes} process(es), are not blocks of "
            f"num_generations={generations} completions of one prompt each.",
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


def policy(t: Any) -> torch.nn.Module:
    """Trainer `t`'s model, unwrapped from its accelerator."""
    return t.accelerator.unwrap_model(t.model)


def no_grad_stats(t: Any, batch: ResponseBatch) -> tuple[Tensor, Tensor]:
    """log p and Σπ² `[B, T]` of `batch` from one no-grad forward of trainer `t`'s policy."""
    model = policy(t)
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            stats = checkpoint_stats(model, batch)
    finally:
        model.train(was_training)
    return stats.logprob, stats.sum_pi2
