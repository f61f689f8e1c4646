"""Online policy-gradient RL on the lab task, on CPU: sample, score, measure, step (`otb-diag
train`). It shows the diagnostics on a run that moves, starting from any lab-style checkpoint.

One step s = 1, 2, ... (verl's numbering: the rollouts of step s come from the policy after s − 1
updates, `checkpoint-<s>` holds the weights after update s):

1. draw `prompts_per_step` prompts: (op, digit count) cells drawn uniformly, with replacement, from
   the lab's rollout prompts (`LabConfig.rollout_prompts`: copy/reverse/sort of 3 to 10 digits,
   where the shipped model's pass rate is between 0 and 1, plus sort-20 and copy-36, which it
   always fails), fresh digits each time;
2. sample `group_size` responses per prompt at `temperature` (all groups in one padded batch),
   score them with the verifier, and
   write them as the project's rollout rows to `rollouts/step-<s>.jsonl`; that file, read back with
   `load_rollouts` and `make_batch`, is the batch, so the trainer sees exactly what
   `otb-diag energy` / `variance-compare` would;
3. per-token statistics (w, entropy) of the batch under the sampling policy (`checkpoint_stats`),
   `W_t = Σ_{j≤t} mask_j w_j`, `G_t`, and the advantages `A` of `baseline`;
4. the surrogate loss (`surrogate_loss`), whose gradient is −ĝ; backward; the gradient norm before
   clipping; clip to `max_grad_norm`; one AdamW step;
5. beside it, the step's noise split within and between its prompts under `baseline` and
   `aggregation`, as TRL's `attach` logs it (`otb/split/<baseline>/...` and the step's shape
   `otb/split/prompts`, ...: head-mode scores of the sampling policy,
   `maths/noise/step_split.py`), so that `otb-diag dynamics` pools it over the run
   (`pipelines/pooled_budget.py`).

The model stays in eval mode (dropout off), so the policy that is differentiated is the one that
sampled. Everything random draws from the seed: prompts from a numpy generator, sampling (the one
sampler, `otb_diag/policy/sampling.py:sample_batch`, through `otb_diag/lab/rollouts.py`) from
torch's global RNG (forked, so the caller's RNG state is left alone). Same seed and thread count,
same metrics (except `wall_time`).

Output layout::

    out/metrics.jsonl                one line per step, written and flushed as the step ends, so a
                                     run that stops keeps every finished step
    out/rollouts/step-<s>.jsonl      the step's rollouts (rollout format, with step, temperature)
    out/checkpoint-<s>/              every `save_every` steps and after the last: safetensors,
                                     config, tokenizer (written to a temporary name, then renamed)
    out/train.json                   settings, initial checkpoint, totals, versions
"""

from __future__ import annotations

import dataclasses
import json
import math
import shutil
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor
from tqdm.auto import tqdm
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from otb_diag.errors import InputError
from otb_diag.io.atomic import write_json, write_jsonl
from otb_diag.io.checkpoint import load_checkpoint, no_transformers_progress_bars
from otb_diag.io.loading import load_rollouts
from otb_diag.io.provenance import library_versions
from otb_diag.io.rollouts.to_batch import make_batch
from otb_diag.io.scenarios import check_scenario
from otb_diag.io.training_logs import OTB_PREFIX
from otb_diag.lab.build import SCENARIOS
from otb_diag.lab.rollouts import sample_groups
from otb_diag.lab.task import Problem, make_problem
from otb_diag.maths.energy.proxies import variance_proxies
from otb_diag.maths.energy.token_stats import TokenStats
from otb_diag.maths.estimators.advantages import batch_advantages
from otb_diag.maths.noise.budget_stream import SPLIT
from otb_diag.maths.noise.step_split import (
    SPLIT_K,
    SPLIT_SEED,
    response_contributions,
    step_shape,
    step_split,
    without_rounding,
)
from otb_diag.maths.response_batch import ResponseBatch
from otb_diag.pipelines.inputs import Inputs, Say, checkpoint_or_default, one_checkpoint, silent
from otb_diag.pipelines.results.train import TrainResult, TrainTotals
from otb_diag.pipelines.shell import run_recipe
from otb_diag.pipelines.train_settings import TrainSettings as TrainSettings  # re-exported
from otb_diag.policy.forward_pass import checkpoint_stats
from otb_diag.policy.scores.token_scores import token_scores
from otb_diag.policy.surrogate_loss import surrogate_loss

# Keys of every metrics.jsonl line, in order (the proxies come from `variance_proxies`); the
# split's `otb/split/...` follow them (`_split`).
METRIC_KEYS = (
    "step",
    "mean_reward",
    "pass_rate",
    "mixed_groups",
    "loss",
    "grad_norm",
    "proxy1_signal_strength",
    "proxy2_total_power",
    "proxy3_pure_noise",
    "expected_a_squared",
    "expected_w",
    "logit_total_power",
    "token_total_power",
    "entropy",
    "mean_response_length",
    "tokens_sampled",
    "wall_time",
    "baseline",  # the run's: `dynamics` names the run by them (it read "?, N=4" without)
    "group_size",
)

# What the printed summary compares between the first and the last steps.
_SUMMARY_KEYS = ("mean_reward", "grad_norm", "entropy", "mean_response_length")


def scenario_settings(scenario: str, **overrides: Any) -> TrainSettings:
    """`TrainSettings` with `overrides` (None keeps a default), `for_scenario`."""
    given = TrainSettings(**{k: v for k, v in overrides.items() if v is not None})
    return for_scenario(given, scenario)


def for_scenario(settings: TrainSettings, scenario: str) -> TrainSettings:
    """`settings` whose prompt cells and response budget, where they are None, are those of an
    embedded scenario's rollouts (`default`: copy/reverse/sort of 3-36 digits, 64 tokens;
    `long`: sums of 3-52 digits, 400 tokens)."""
    lab = SCENARIOS[check_scenario(scenario)]
    cells, budget = settings.prompt_cells, settings.max_new_tokens
    return dataclasses.replace(
        settings,
        prompt_cells=lab.rollout_prompts if cells is None else cells,
        max_new_tokens=lab.max_new_tokens if budget is None else budget,
    )


def _draw_prompts(
    rng: np.random.Generator, n: int, cells: tuple[tuple[str, int], ...]
) -> list[str]:
    """`n` prompts: (op, digit count) cells drawn uniformly with replacement, random digits."""
    picks = rng.integers(0, len(cells), size=n)
    return [make_problem(rng, *cells[k]).prompt for k in picks]


def step_metrics(
    step: int,
    batch: ResponseBatch,
    stats: TokenStats,
    advantages: Tensor,
    loss: float,
    grad_norm: float,
) -> dict[str, Any]:
    """One metrics line, without the running totals (`tokens_sampled`, `wall_time`)."""
    mask = batch.mask
    k = len(batch.group_names)
    spread = [
        torch.zeros(k).scatter_reduce(0, batch.group, batch.reward, how, include_self=False)
        for how in ("amin", "amax")
    ]  # each group's lowest and highest reward
    mixed = spread[1] > spread[0]  # [K]: groups a group baseline can learn from
    return {
        "step": step,
        "mean_reward": batch.reward.mean().item(),
        "pass_rate": (batch.reward >= 1).float().mean().item(),  # share the verifier accepts
        "mixed_groups": mixed.float().mean().item(),
        "loss": loss,
        "grad_norm": grad_norm,
        **variance_proxies(
            advantages, mask, stats.w, temperature=batch.temperature, grad_norm=grad_norm
        ),
        "entropy": ((stats.entropy * mask).sum() / mask.sum()).item(),  # mean over tokens
        "mean_response_length": batch.length.float().mean().item(),
    }


def save_checkpoint(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, dest: Path) -> None:
    """Hugging Face checkpoint (safetensors + tokenizer) at `dest`, renamed into place whole."""
    tmp = dest.with_name(f".{dest.name}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    with no_transformers_progress_bars():  # the training bar is enough
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
    shutil.rmtree(dest, ignore_errors=True)
    tmp.rename(dest)


def _clear_previous_run(out: Path) -> None:
    """Remove an earlier run's steps, so that `out` always describes one run."""
    for stale in out.glob("checkpoint-*"):
        shutil.rmtree(stale)
    for stale in (out / "rollouts").glob("step-*.jsonl"):
        stale.unlink()


def _json_line(metrics: dict[str, Any]) -> str:
    """Strict JSON: a diverged run's NaN or inf becomes null."""
    finite = {
        k: None if isinstance(v, float) and not math.isfinite(v) else v for k, v in metrics.items()
    }
    return json.dumps(finite, allow_nan=False) + "\n"


def run_train(
    inputs: Inputs,
    out: Path,
    settings: TrainSettings = TrainSettings(),
    *,
    progress: bool = True,
    say: Say = silent,
) -> TrainResult | None:
    """`otb-diag train` as given: `settings` with the scenario's prompt cells and response
    budget where they leave them (`for_scenario`), from the one checkpoint of `inputs.ckpt` or
    the scenario's final one (said through `say`); then `train`, in the recipe shell (None on
    the ranks other than 0 under torchrun). It samples its own rollouts: `inputs.rollouts` is
    refused."""
    settings.check()  # the knobs' own checks ran when `settings` was built
    inputs.refuse(("rollouts",), "train samples its own")
    given = one_checkpoint(inputs.ckpt, "training starts from one checkpoint")
    start = checkpoint_or_default(given, inputs.scenario, say)
    settings = for_scenario(settings, inputs.scenario)
    # Unstaged: metrics.jsonl and the checkpoints are kept by a run stopped halfway. `train`
    # writes train.json last itself (the figures' trainings call it directly).
    return run_recipe(
        lambda stage: train(start, out, settings, progress=stage.progress),
        out=out,
        record=None,
        progress=progress,
        every_rank=False,
        staged=False,
    )


def train(
    ckpt: Path, out: Path, settings: TrainSettings = TrainSettings(), *, progress: bool = True
) -> TrainResult:
    """Run `settings.steps` RL steps from the checkpoint `ckpt`, writing into `out` (module
    docstring); returns the result whose `to_json()` is `out/train.json`."""
    settings.check()
    loaded = load_checkpoint(ckpt, dtype="float32")
    model, tokenizer = loaded.model, loaded.tokenizer
    _check_positions(model, tokenizer, settings)
    out.mkdir(parents=True, exist_ok=True)
    _clear_previous_run(out)
    optimizer = torch.optim.AdamW(model.parameters(), lr=settings.lr, weight_decay=0.0)
    rng = np.random.default_rng(settings.seed)
    clip = settings.max_grad_norm if settings.max_grad_norm > 0 else math.inf
    tokens_sampled = 0
    history: list[dict[str, Any]] = []
    started = time.perf_counter()
    with (
        torch.random.fork_rng(devices=[]),
        (out / "metrics.jsonl").open("w", encoding="utf-8") as log,
        tqdm(total=settings.steps, desc="train", unit="step", disable=not progress) as bar,
    ):
        torch.manual_seed(settings.seed)
        for step in range(1, settings.steps + 1):
            prompts = _draw_prompts(rng, settings.prompts_per_step, settings.prompt_cells)
            rows_path = out / "rollouts" / f"step-{step}.jsonl"
            write_jsonl(
                rows_path,
                sample_groups(
                    model, tokenizer, prompts, group_size=settings.group_size,
                    temperature=settings.temperature, max_new_tokens=settings.max_new_tokens,
                    step=step, together=True,
                ),
            )  # fmt: skip
            batch = make_batch(load_rollouts(rows_path))
            metrics = _update(model, optimizer, batch, settings, step, clip)
            tokens_sampled += int(batch.length.sum())
            metrics |= {
                "tokens_sampled": tokens_sampled,
                "wall_time": time.perf_counter() - started,
                "baseline": settings.baseline,
                "group_size": settings.group_size,
            }
            log.write(_json_line(metrics))
            log.flush()
            history.append(metrics)
            if step == settings.steps or (settings.save_every and step % settings.save_every == 0):
                save_checkpoint(model, tokenizer, out / f"checkpoint-{step}")
            bar.set_postfix(
                step=step,
                reward=f"{metrics['mean_reward']:.3f}",
                grad_norm=f"{metrics['grad_norm']:.3g}",
            )
            bar.update(1)

    result = TrainResult(
        checkpoint=str(loaded.path),
        settings=settings,
        **_early_and_late(history),
        totals=TrainTotals(
            steps=settings.steps,
            tokens_sampled=tokens_sampled,
            wall_time=time.perf_counter() - started,
        ),
        versions=library_versions(),
        out=str(out.resolve()),
    )
    write_json(out / "train.json", result.to_json())
    return result


def _check_positions(model: Any, tokenizer: Any, settings: TrainSettings) -> None:
    """The longest prompt of the task plus `max_new_tokens` must fit the model's positions."""
    longest_prompt = max(
        len(tokenizer.encode(Problem(op, "0" * n).prompt, add_special_tokens=False))
        for op, n in settings.prompt_cells
    )
    positions = getattr(model.config, "n_positions", math.inf)  # GPT-2's name, as the lab's
    if longest_prompt + settings.max_new_tokens > positions:
        raise InputError(
            f"prompts of up to {longest_prompt} tokens plus max_new_tokens "
            f"{settings.max_new_tokens} exceed the model's {positions} positions.",
            field="max_new_tokens",
        )


def _update(
    model: Any,
    optimizer: torch.optim.Optimizer,
    batch: ResponseBatch,
    settings: TrainSettings,
    step: int,
    clip: float,
) -> dict[str, Any]:
    """One policy-gradient step on the sampled `batch`: w under the sampling policy, the
    `--baseline` advantages, the surrogate's gradient −ĝ, clipped; returns the step's metrics."""
    stats = checkpoint_stats(model, batch)  # no grad: w, entropy of the sampling policy
    found = batch_advantages(batch, stats.w, [settings.baseline])
    advantages = found.by_baseline[settings.baseline]
    split = _split(model, batch, without_rounding(advantages, found.returns), settings)
    optimizer.zero_grad(set_to_none=True)
    loss = surrogate_loss(model, batch, advantages, settings.aggregation)
    loss.backward()  # .grad = −ĝ
    # ‖ĝ‖ before clipping (clip_grad_norm_ returns the norm it measured).
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), clip).item()
    optimizer.step()
    return step_metrics(step, batch, stats, advantages, loss.item(), grad_norm) | split


def _split(
    model: Any, batch: ResponseBatch, advantages: Tensor, settings: TrainSettings
) -> dict[str, float]:
    """`otb/split/<baseline>/<name>` (`step_split.SPLIT`) and `otb/split/<shape>` of the step,
    from head-mode scores of the policy that sampled it (before its update). advantages:
    `[B, T]` the baseline's, less their rounding (`step_split.without_rounding`)."""
    scores = token_scores(model, batch, "head", SPLIT_K, SPLIT_SEED).proj  # [B, T, k]
    x = response_contributions(scores, advantages, batch.mask, settings.aggregation)  # [B, k]
    split = {f"{settings.baseline}/{k}": v for k, v in step_split(x, batch.group).items()}
    split |= step_shape(batch.mask, batch.group)
    return {OTB_PREFIX + SPLIT + k: v for k, v in split.items()}


def _early_and_late(history: list[dict[str, Any]]) -> dict[str, Any]:
    """Means of the first and the last k ≤ 5 steps: one step's reward is too noisy to compare
    (8 prompts of very different difficulty)."""
    k = max(1, min(5, len(history) // 2))

    def mean(lines: list[dict[str, Any]]) -> dict[str, float]:
        return {key: float(np.mean([m[key] for m in lines])) for key in _SUMMARY_KEYS}

    return {"window": k, "early": mean(history[:k]), "late": mean(history[-k:])}
