"""`otb-diag energy`: per-token statistics, realized energy, baselines and figures 3–5."""

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


@friendly_errors
def energy(
    ckpt: CkptOption = None,
    rollouts: RolloutsOption = None,
    out: OutOption = Path("otb-energy"),
    baselines: Annotated[
        str | None,
        typer.Option(
            "--baselines",
            help="Comma-separated registry baselines, e.g. none,mean,otb,otb-loo. Default: the "
            "registry's defaults (an unknown name lists every registered one).",
        ),
    ] = None,
    temperature: TemperatureOption = None,
    model_free: Annotated[
        bool,
        typer.Option(
            "--model-free",
            help="No checkpoint: use the rollouts' logprobs and sum_pi2 (entropy unavailable).",
        ),
    ] = False,
    device: DeviceOption = "auto",
    device_map: DeviceMapOption = None,
    dtype: DtypeOption = "auto",
    full_hash: FullHashOption = False,
    batch_tokens: BatchTokensOption = 16384,
    chunk_size: ChunkSizeOption = 256,
    group: Annotated[
        str | None,
        typer.Option("--group", help="Group shown in fig3/fig4. Default: most heterogeneous."),
    ] = None,
    handle_zero_tail: ZeroTailOption = True,
    steps: StepsOption = None,
    reward_column: RewardColumnOption = None,
    chat_template: ChatTemplateOption = False,
    trainer_baseline: Annotated[
        str | None,
        typer.Option(
            "--trainer-baseline",
            metavar="NAME",
            help="Audit the advantages the rollouts carry (trainer_advantage; TRL's advantage) "
            "against this registry baseline, or verl's algorithm.adv_estimator name (grpo, "
            "rloo, optimal_token_baseline, tir_optimal_token_baseline). Default for TRL "
            "completion logs: grpo with ε = 1e-4, TRL's GRPO.",
        ),
    ] = None,
    allow_pickle: AllowPickleOption = False,
    trust_remote_code: RemoteCodeOption = False,
    as_json: JsonOption = False,
    quiet: QuietOption = False,
    scenario: ScenarioOption = "default",
) -> None:
    """Realized energy of every response token: log-prob, Σπ², entropy, the logit-gradient
    proxy w = 1 − 2p + Σπ² (÷τ²) and its running sum W_t; the advantages each baseline gives;
    the forward-only variance proxies; and figures 3–5 of the OTB paper.

    Writes into --out: tokens.parquet, sequences.csv, groups.csv, proxies.json, summary.json and
    fig3/fig4/fig5 (+ fig_energy_by_step with several checkpoints) as PNG and PDF. When the
    rollouts carry the trainer's advantages, they are audited against its estimator.

    Example: otb-diag energy --ckpt ./checkpoint-200 --rollouts rollouts.jsonl --out energy/
    """
    from otb_diag.io.loading import LoadOptions
    from otb_diag.io.scenarios import default_rollouts
    from otb_diag.pipelines.energy.recipe import EnergySettings, format_summary, run_energy

    rollouts_path = or_default(rollouts, lambda: default_rollouts(scenario), "--rollouts")
    if model_free:
        if ckpt:
            note("--model-free given: ignoring --ckpt")
        checkpoints: list[Path] = []
    else:
        checkpoints = checkpoint_dirs(ckpt, scenario)
    settings = EnergySettings(
        **(
            {"baselines": tuple(b.strip() for b in baselines.split(",") if b.strip())}
            if baselines
            else {}
        ),
        temperature=temperature,
        batch_tokens=batch_tokens,
        chunk_size=chunk_size,
        group=group,
        handle_zero_tail=handle_zero_tail,
        load=LoadOptions(
            device, dtype, allow_pickle, trust_remote_code, chat_template, device_map, full_hash
        ),
        steps=steps,
        reward_columns=tuple(reward_column) if reward_column else None,
        trainer_baseline=trainer_baseline,
    )
    summary = run_energy(checkpoints, rollouts_path, out, settings, progress=not quiet)
    if summary is None:  # a rank other than 0 under torchrun: rank 0 reports
        return
    untemplated = summary["totals"]["prompts_without_chat_template"]
    if untemplated:
        note(
            f"note: {untemplated} prompts were tokenized without the checkpoint's chat template; "
            "trainers dump text without special tokens, so if the trainer applied the template, "
            "pass --chat-template (or dump exact ids: see the README)"
        )
    if as_json:
        print_json(summary)
    else:
        typer.echo(format_summary(summary))
