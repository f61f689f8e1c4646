"""`otb-diag train`: online policy-gradient RL on the toy lab task, on CPU."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from otb_diag.cli.common import (
    CkptOption,
    JsonOption,
    OutOption,
    QuietOption,
    ScenarioOption,
    friendly_errors,
    one_checkpoint,
    or_default,
    print_json,
)


@friendly_errors
def train(
    ckpt: CkptOption = None,
    baseline: Annotated[
        str,
        typer.Option(
            "--baseline",
            help="Any registry baseline (e.g. mean, rloo, grpo, optseq, otb, otb-loo).",
        ),
    ] = "otb",
    group_size: Annotated[
        int, typer.Option("--group-size", help="Responses sampled per prompt (N).")
    ] = 4,
    aggregation: Annotated[
        str,
        typer.Option(
            "--aggregation",
            help="How token terms are averaged: token-sum, seq-mean-token-mean, token-mean, "
            "seq-mean-token-sum-norm.",
        ),
    ] = "token-sum",
    prompts_per_step: Annotated[
        int, typer.Option("--prompts-per-step", help="Prompts (groups) per step.")
    ] = 8,
    lr: Annotated[
        float, typer.Option("--lr", help="AdamW learning rate (no weight decay).")
    ] = 1e-4,
    updates: Annotated[
        int,
        typer.Option(
            "--updates",
            min=1,
            help="Optimizer updates to take, one per training step.",
        ),
    ] = 20,
    max_new_tokens: Annotated[
        int | None,
        typer.Option(
            "--max-new-tokens",
            help="Longest response sampled. Default: the scenario's (default 64, long 400).",
        ),
    ] = None,
    temperature: Annotated[
        float, typer.Option("--temperature", help="Sampling temperature τ.")
    ] = 1.0,
    seed: Annotated[
        int, typer.Option("--seed", help="Seed of prompts and sampling: same seed, same run.")
    ] = 0,
    save_every: Annotated[
        int,
        typer.Option(
            "--save-every", help="Save checkpoint-<step> every this many steps (0: last only)."
        ),
    ] = 10,
    max_grad_norm: Annotated[
        float, typer.Option("--max-grad-norm", help="Clip the gradient norm to this (0: off).")
    ] = 1.0,
    out: OutOption = Path("otb-train"),
    as_json: JsonOption = False,
    quiet: QuietOption = False,
    scenario: ScenarioOption = "default",
) -> None:
    """Policy-gradient RL on a lab task from a lab checkpoint: the scenario's prompts (default:
    copy / reverse / sort digits; long: running sums with a scratchpad) with fresh digits.

    Each step draws --prompts-per-step prompts, samples --group-size responses per prompt, scores
    them with the verifier, computes w and the --baseline advantages A with the same code as
    `otb-diag energy`, and takes one AdamW step on the surrogate
    L = −Σ c·A·log π(y_t) (c: the --aggregation weights), whose gradient is −ĝ.

    Writes into --out: metrics.jsonl (one line per step: reward, pass rate, grad norm before
    clipping, variance proxies, entropy, lengths, tokens sampled, wall time),
    rollouts/step-<s>.jsonl (sampled by the weights of step s−1, ready for `otb-diag energy`),
    checkpoint-<s>/ (every --save-every steps and the last) and train.json.

    --ckpt is the one lab checkpoint training starts from.

    Example: otb-diag train --baseline otb --group-size 4 --updates 20 --out run/
    """
    from otb_diag.io.scenarios import default_checkpoint
    from otb_diag.pipelines.rl_training import scenario_settings
    from otb_diag.pipelines.rl_training import train as run_training

    settings = scenario_settings(
        scenario,
        baseline=baseline,
        aggregation=aggregation,
        group_size=group_size,
        prompts_per_step=prompts_per_step,
        steps=updates,
        lr=lr,
        max_grad_norm=max_grad_norm,
        temperature=temperature,
        max_new_tokens=max_new_tokens,
        save_every=save_every,
        seed=seed,
    )
    given = one_checkpoint(ckpt, "training starts from one checkpoint")
    start = or_default(given, lambda: default_checkpoint(scenario), "--ckpt")
    result = run_training(start, out, settings, progress=not quiet)
    if as_json:
        print_json(result.to_json())
    else:
        typer.echo(result.format())
