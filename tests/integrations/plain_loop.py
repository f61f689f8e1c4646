"""The live core's third adapter: a plain PyTorch policy-gradient loop (REINFORCE with the group
mean as baseline, no trainer library) on the embedded checkpoint, handing each step's rows to
`LiveCore` as TRL's and verl's adapters hand theirs. tests/integrations/test_live_core.py runs it
on one process; tests/integrations/test_live_sharded.py on 2 gloo processes under FSDP2's
`fully_shard` (`plain_fsdp.py`), each process sampling and training its own groups and the main
one measuring the step the core gathered from all, on the core's worker thread beside the
backward pass.

Each group is sampled by its own `generate` call, seeded by its step and prompt, so its rows do
not depend on the process that samples it: the sharded run's steps are the one-process run's.
The loss is `Σ_i Σ_t −A_i log π(y_it) / (B · MAX_NEW)` over the B rows of the process (a
constant length, so that FSDP's mean over the processes of their gradients is the gradient of
the one-process loss over all rows: `seq-mean-token-sum-norm`).

The split's scores come from one extra forward on the main process (`token_scores`), or, with
`from_loss`, from each process's own loss forward (`split_capture.py:HiddenCatch`, as TRL's
adapter forms them: under FSDP2 with the output layer gathered for the scoring), handed over
with the rows."""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor, nn
from torch.distributed.tensor import DTensor
from trl_toy import correct

from otb_diag.integrations.core.generation_stats import GenerationStats
from otb_diag.integrations.core.live_core import LiveCore
from otb_diag.integrations.core.step_metrics import round_off_clamped
from otb_diag.integrations.trl.split_capture import HiddenCatch
from otb_diag.maths.response_batch import ResponseBatch
from otb_diag.policy.scores.token_scores import token_scores

N, MAX_NEW = 4, 6  # responses a prompt, tokens a response at most
AGGREGATION = "seq-mean-token-sum-norm"  # the loss's (module docstring)
END = 2  # the toy tokenizer's <end>


@dataclass
class Group:
    """One prompt's N sampled responses, on the process that sampled them."""

    prompt_ids: list[int]
    response_ids: Tensor  # [N, C], 0 after <end>
    length: Tensor  # [N] through <end>, C without one
    logprobs: Tensor  # [N, C] of the sampling policy (`GenerationStats`)
    sum_pi2: Tensor  # [N, C]
    reward: Tensor  # [N]
    scores: Tensor | None = None  # [N, C, k] the split's, from this process's loss forward

    @property
    def advantage(self) -> Tensor:
        """`[N]` A = R − the group's mean."""
        return self.reward - self.reward.mean()


@dataclass
class Step:
    """What the loop logged at a step (main process): every metric `LiveCore.finish` gave, and
    the gradient norm it fed the collapse watch."""

    metrics: dict[str, float]
    grad_norm: float


def sample_group(
    model: nn.Module,
    tokenizer: object,
    caught: GenerationStats,
    prompt: str,
    tau: float,
    seed: int,
    synced: bool,
) -> Group:
    """N responses to `prompt` at temperature `tau`, drawn under `seed`; `synced`: several
    processes generate together (FSDP: every forward is a collective, transformers' synced_gpus)."""
    ids = torch.tensor([tokenizer(prompt)["input_ids"]])  # type: ignore[operator]
    torch.manual_seed(seed)
    with torch.no_grad():
        out = model.generate(
            input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=True, temperature=tau,
            top_k=0, max_new_tokens=MAX_NEW, num_return_sequences=N, pad_token_id=0,
            synced_gpus=synced,
        )  # fmt: skip
    taken = caught.taken()
    assert taken is not None, "generate's forwards were not caught"
    response = out[:, ids.shape[1] :]
    assert taken[0].shape == response.shape, "not the generated tokens' statistics"
    ended = response == END
    width = response.shape[1]
    length = torch.where(ended.any(1), ended.int().argmax(1) + 1, width)
    texts = tokenizer.batch_decode(response, skip_special_tokens=True)  # type: ignore[attr-defined]
    reward = torch.tensor(correct([prompt] * N, texts))
    return Group(ids[0].tolist(), response, length, *taken, reward)


def padded(tensors: Sequence[Tensor]) -> Tensor:
    """`[n_g, C_g, ...]` tensors one after the other, right-padded with 0 to the widest C."""
    width = max(x.shape[1] for x in tensors)
    pads = [(0, 0) * (x.dim() - 2) + (0, width - x.shape[1]) for x in tensors]  # dim 1 only
    return torch.cat([nn.functional.pad(x, pad) for x, pad in zip(tensors, pads, strict=True)])


def step_batch(prompts: Sequence[str], groups: Sequence[Group], step: int, tau: float):
    """The step's `ResponseBatch` (`[B, T]`, B = N · the groups, in prompt order)."""
    return ResponseBatch.from_padded(
        group_names=prompts, group=torch.arange(N * len(groups)) // N,
        prompt_ids=[g.prompt_ids for g in groups for _ in range(N)],
        response_ids=padded([g.response_ids for g in groups]),
        length=torch.cat([g.length for g in groups]), temperature=tau, step=step,
        reward=torch.cat([g.reward for g in groups]),
        **round_off_clamped(padded([g.logprobs for g in groups]),
                            padded([g.sum_pi2 for g in groups])),
        trainer_advantage=torch.cat([g.advantage for g in groups]),
    )  # fmt: skip


def group_loss(
    model: nn.Module, g: Group, tau: float, catch: HiddenCatch | None, k: int | None
) -> Tensor:
    """`Σ_i Σ_t −A_i log π(y_it)` over the group's response tokens (∇ = −Σ A ∇log π); with
    `catch`, the group's split scores of dimension `k` from this forward (`g.scores`)."""
    prompt = len(g.prompt_ids)
    sequences = torch.cat([torch.tensor([g.prompt_ids] * N), g.response_ids], 1)
    with catch.catching(True) if catch else contextlib.nullcontext([]) as hidden:
        logits = model(sequences).logits[:, prompt - 1 : -1] / tau  # causal: 0s after <end>
    token_logp = logits.log_softmax(-1).gather(-1, g.response_ids[..., None])[..., 0]  # [N, C]
    valid = torch.arange(g.response_ids.shape[1]) < g.length[:, None]
    if catch is not None and k is not None:  # every process: a collective under FSDP2
        g.scores = catch.scores(hidden, g.response_ids, tau, k, token_logp.detach(), valid)
    return -(g.advantage[:, None] * token_logp * valid).sum()


def prompts_per_step(core: LiveCore) -> int | None:
    """The prompts the next step samples: the knee controller's decision (`core.controller`,
    made on the main process and taken by every process), or None (all offered) without
    one."""
    if core.controller is None:
        return None
    decided = core.controller.prompts if core.place.is_main else None
    return core.place.all_gather(decided)[0]


def plain_loop(
    model: nn.Module,
    tokenizer: object,
    core: LiveCore,
    steps: Sequence[Sequence[str]],
    tau: float,
    *,
    split_k: int | None = None,
    from_loss: bool = False,
    lr: float = 0.1,
) -> list[Step]:
    """One step for each prompt list of `steps`, process r of W (`core.place`) sampling and
    training prompts r, r + W, …; the main process measures each whole step by `core` (the split
    from head-mode scores of dimension `split_k`: of an extra forward on the main process, one
    process only, or with `from_loss` of every process's loss forward, as sharded) and returns
    what it logged. With the knee controller (`core.controller`), a step samples the first of its
    prompts that the controller decided (`prompts_per_step`): the loop varies its batch
    directly, where TRL's gate accumulates batches."""
    caught = GenerationStats(model, tau)  # log p and Σπ² of the sampling forwards
    catch = HiddenCatch(model, sharded=True) if split_k is not None and from_loss else None
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    rank, world = core.place.rank, core.place.world_size
    logged = []
    for step, offered in enumerate(steps, 1):
        prompts = offered[: prompts_per_step(core)]
        if core.controller is not None:  # this step's update: its batch, as sampled
            core.controller.applying(len(prompts))
        mine = [
            sample_group(model, tokenizer, caught, prompts[i], tau, 1000 * step + i, world > 1)
            for i in range(rank, len(prompts), world)
        ]
        # the loss forwards, before the step's scores: the weights that sampled the batch
        losses = [group_loss(model, g, tau, catch, split_k) for g in mine]
        shares = core.gather(step, mine.copy) if core.enabled else None  # [W][groups]
        if shares is not None and core.place.is_main:
            every = [shares[i % world][i // world] for i in range(len(prompts))]  # prompt order
            batch = step_batch(prompts, every, step, tau)
            scores = None
            if catch is not None:  # [B, T, k], zero past each response
                scores = padded([g.scores for g in every]) * batch.valid[..., None]
            elif split_k is not None:
                model.eval()
                scores = token_scores(model, batch, "head", split_k, 0).proj
                model.train()
            core.submit(batch, step, scores)  # measured beside the backward pass
        loss = sum(losses) / (N * len(mine) * MAX_NEW)
        optimizer.zero_grad()
        loss.backward()  # under FSDP: the mean over the processes, reduce-scattered
        norm = nn.utils.clip_grad_norm_(model.parameters(), 1e9)
        grad_norm = float(norm.full_tensor() if isinstance(norm, DTensor) else norm)  # FSDP
        optimizer.step()
        if core.controller is not None:
            core.controller.updated()
        core.add_grad_norm(step, grad_norm)
        collected = core.collect()  # the main process's measured step; an error is raised
        if collected is not None:
            logged.append(Step(collected[1], grad_norm))
    return logged
