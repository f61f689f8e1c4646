"""`otb-diag variance-compare`: empirical policy-gradient variance under each baseline."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from otb_diag.cli.common import (
    AllowPickleOption,
    BatchTokensOption,
    ChatTemplateOption,
    ChunkSizeOption,
    CkptOption,
    DeviceMapOption,
    DeviceOption,
    DtypeOption,
    FullHashOption,
    JsonOption,
    OutOption,
    QuietOption,
    RemoteCodeOption,
    RewardColumnOption,
    RolloutsOption,
    ScenarioOption,
    StepsOption,
    TemperatureOption,
    ZeroTailOption,
    checkpoint_dirs,
    friendly_errors,
    note,
    or_default,
    print_json,
)


def _csv(text: str) -> tuple[str, ...]:
    return tuple(part.strip() for part in text.split(",") if part.strip())


_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0}


def _seconds(text: str) -> float:
    """`90`, `90s`, `30m`, `2h` -> seconds (whether positive, `VarianceSettings.check` says)."""
    from otb_diag.errors import InputError

    value, unit = (text[:-1], text[-1]) if text[-1:] in _UNITS else (text, "s")
    try:
        seconds = float(value) * _UNITS[unit]
    except ValueError:
        raise InputError(
            f"budget must look like 90s, 30m or 2h, got '{text}'", field="budget"
        ) from None
    return seconds


@friendly_errors
def variance_compare(
    ckpt: CkptOption = None,
    rollouts: RolloutsOption = None,
    steps: StepsOption = None,
    reward_column: RewardColumnOption = None,
    chat_template: ChatTemplateOption = False,
    out: OutOption = Path("otb-variance"),
    mode: Annotated[
        str,
        typer.Option(
            "--mode",
            help="Comma-separated: proxy (forward only; synthetic scores with ‖s_t‖² = w_t), "
            "head (exact output-layer gradients, Kronecker-sketched), full (exact gradients of "
            "all parameters, JL-projected by forward- or reverse-mode autodiff; its cost "
            "estimate is printed first).",
        ),
    ] = "proxy,head",
    group_sizes: Annotated[
        str,
        typer.Option(
            "--group-sizes",
            help="Group sizes N; those above M/2 (M: the smallest pool) are left out, so the "
            "default measures 2-16 on pools of 32 and 2-64 on pools of 128.",
        ),
    ] = "2,4,8,16,32,64",
    draws: Annotated[int, typer.Option("--draws", help="Groups drawn per prompt and N.")] = 200,
    baselines: Annotated[
        str | None,
        typer.Option(
            "--baselines",
            help="Comma-separated registry baselines; must include none and mean. Default: the "
            "registry's defaults (an unknown name lists every registered one).",
        ),
    ] = None,
    aggregations: Annotated[
        str,
        typer.Option("--aggregations", help="token-sum, seq-mean-token-mean, token-mean."),
    ] = "token-sum,seq-mean-token-mean,token-mean",
    sketch_dim: Annotated[
        int, typer.Option("--sketch-dim", help="Dimension k of the projected score vectors.")
    ] = 256,
    bootstrap: Annotated[int, typer.Option("--bootstrap", help="Bootstrap resamples.")] = 1000,
    seed: Annotated[int, typer.Option("--seed", help="Seed of draws and projections.")] = 0,
    force: Annotated[
        bool, typer.Option("--force", help="Run full mode even when its estimate exceeds --budget.")
    ] = False,
    engine: Annotated[
        str,
        typer.Option(
            "--engine",
            help="Full mode: jvp (forward mode, k passes for all tokens at once; per-token norms "
            "estimated), vjp (reverse mode, one backward per token; exact norms) or auto (the "
            "cost model's choice).",
        ),
    ] = "auto",
    params: Annotated[
        str | None,
        typer.Option(
            "--params",
            metavar="REGEX",
            help="Full mode: project only the parameters whose name matches (e.g. 'lm_head', "
            "'layers\\.(2[0-9])\\.', 'lora_').",
        ),
    ] = None,
    by_block: Annotated[
        bool,
        typer.Option(
            "--by-block",
            help="Full mode: directions per parameter block (embeddings, each layer, final "
            "norm, head); writes variance_blocks.csv and per-block fidelity.",
        ),
    ] = False,
    directions_per_block: Annotated[
        int | None,
        typer.Option(
            "--directions-per-block",
            help="With --by-block: directions per block (default ⌈sketch-dim / blocks⌉). "
            "Forward mode costs one pass per direction and block.",
        ),
    ] = None,
    budget: Annotated[
        str,
        typer.Option(
            "--budget",
            help="Full mode refuses runs estimated longer than this (e.g. 90s, 30m, 2h) "
            "unless --force.",
        ),
    ] = "2h",
    prompts_per_step: Annotated[
        int | None,
        typer.Option(
            "--prompts-per-step",
            min=1,
            help="The batch of prompts your trainer takes a step on: the SNR |G|²/(tr Σ/P) is "
            "given there. Default: the prompts of the rollouts.",
        ),
    ] = None,
    current_n: Annotated[
        int,
        typer.Option(
            "--current-n",
            min=1,
            help="The responses per prompt you train with (verl rollout.n, TRL "
            "num_generations): the recommendation compares against mean at this N.",
        ),
    ] = 8,
    temperature: TemperatureOption = None,
    device: DeviceOption = "auto",
    device_map: DeviceMapOption = None,
    dtype: DtypeOption = "auto",
    full_hash: FullHashOption = False,
    batch_tokens: BatchTokensOption = 16384,
    chunk_size: ChunkSizeOption = 256,
    handle_zero_tail: ZeroTailOption = True,
    allow_pickle: AllowPickleOption = False,
    trust_remote_code: RemoteCodeOption = False,
    as_json: JsonOption = False,
    quiet: QuietOption = False,
    scenario: ScenarioOption = "default",
) -> None:
    """Does a baseline really lower the variance of the policy gradient on your model and data?
    From pools of M responses per prompt, draw R groups of N per prompt (the same draws for
    every baseline), compute the gradient estimate with real per-token score vectors, and
    report its variance with a bootstrap 95 % interval, the ratio to the mean baseline, a bias
    z-score against no baseline, and the equivalent group size: the N′ at which the mean baseline
    reaches this baseline's variance (the paper's "OTB at N = 4 matches mean at N = 32").

    Then how many prompts a step needs: the noise of a step split into within-prompt variance
    (what a baseline reduces) and between-prompt spread (what none does), the gradient noise
    scale B = tr Σ/|G|² in prompts and in tokens per step, and the (baseline, N) whose knee
    costs the fewest tokens, beside mean at --current-n. Use head or full mode for the knee:
    proxy scores carry no signal (|G|² = 0), so proxy mode gives the split only.

    Writes variance.csv, noise_scale.csv, fidelity.csv, summary.json and figures (variance
    against N, ratio to mean, tokens at the knee, proxy fidelity) into --out.

    Example: otb-diag variance-compare --mode head,full --group-sizes 2,4,8 --draws 200
    """
    from otb_diag.errors import InputError
    from otb_diag.io.loading import LoadOptions
    from otb_diag.io.scenarios import default_rollouts
    from otb_diag.pipelines.variance.recipe import VarianceSettings, run_variance
    from otb_diag.pipelines.variance.summary import format_summary

    try:
        sizes = tuple(int(n) for n in _csv(group_sizes))
    except ValueError:
        raise InputError(
            f"group sizes must be integers, got '{group_sizes}'", field="group-sizes"
        ) from None
    rollouts_path = or_default(rollouts, lambda: default_rollouts(scenario), "--rollouts")
    settings = VarianceSettings(
        modes=_csv(mode),
        **({"baselines": _csv(baselines)} if baselines else {}),
        aggregations=_csv(aggregations),
        group_sizes=sizes,
        draws=draws,
        bootstrap=bootstrap,
        sketch_dim=sketch_dim,
        seed=seed,
        force=force,
        temperature=temperature,
        steps=steps,
        reward_columns=tuple(reward_column) if reward_column else None,
        batch_tokens=batch_tokens,
        chunk_size=chunk_size,
        handle_zero_tail=handle_zero_tail,
        load=LoadOptions(
            device, dtype, allow_pickle, trust_remote_code, chat_template, device_map, full_hash
        ),
        engine=engine,
        params=params,
        by_block=by_block,
        directions_per_block=directions_per_block,
        budget_s=_seconds(budget),
        prompts_per_step=prompts_per_step,
        current_n=current_n,
    )
    settings.check()  # before the default checkpoint is looked up
    summary = run_variance(
        checkpoint_dirs(ckpt, scenario),
        rollouts_path,
        out,
        settings,
        progress=not quiet,
        notify=None if quiet else note,
    )
    if summary is None:  # a rank other than 0 under torchrun: rank 0 reports
        return
    if as_json:
        print_json(summary)
    else:
        typer.echo(format_summary(summary))
