"""`otb-diag energy`: per-token statistics, realized energy, baselines and figures 3–5."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from cli.common import friendly_errors, note, or_default, print_json


@friendly_errors
def energy(
    ckpt: Annotated[
        list[Path] | None,
        typer.Option(
            "--ckpt",
            help="Checkpoint directory (HF causal LM), repeatable; or a run directory holding "
            "checkpoint-* (HF Trainer/TRL) or global_step_* (verl) checkpoints. "
            "Default: the embedded final checkpoint.",
        ),
    ] = None,
    rollouts: Annotated[
        Path | None,
        typer.Option(
            "--rollouts", help="Rollouts file (JSONL/Parquet/verl dump). Default: embedded."
        ),
    ] = None,
    out: Annotated[Path, typer.Option("--out", help="Output directory.")] = Path("otb-energy"),
    baselines: Annotated[
        str,
        typer.Option(
            "--baselines",
            help="Comma-separated baselines: none, mean, grpo, rloo, optseq, otb, optseq-loo, "
            "otb-loo.",
        ),
    ] = "none,mean,grpo,rloo,optseq,otb",
    temperature: Annotated[
        float | None,
        typer.Option("--temperature", help="Sampling temperature τ; default: each row's own."),
    ] = None,
    model_free: Annotated[
        bool,
        typer.Option(
            "--model-free",
            help="No checkpoint: use the rollouts' logprobs and sum_pi2 (entropy unavailable).",
        ),
    ] = False,
    device: Annotated[str, typer.Option("--device", help="cpu, cuda, cuda:1, ...")] = "cpu",
    dtype: Annotated[
        str, typer.Option("--dtype", help="auto (the checkpoint's), float32, bfloat16, float16.")
    ] = "auto",
    batch_tokens: Annotated[
        int, typer.Option("--batch-tokens", help="Padded tokens per forward batch.")
    ] = 16384,
    chunk_size: Annotated[
        int, typer.Option("--chunk-size", help="Tokens whose [chunk, V] logits exist at once.")
    ] = 256,
    group: Annotated[
        str | None,
        typer.Option("--group", help="Group shown in fig3/fig4. Default: most heterogeneous."),
    ] = None,
    handle_zero_tail: Annotated[
        bool,
        typer.Option(
            "--handle-zero-tail/--no-handle-zero-tail",
            help="verl's OTB option: a strictly longest member gets B_t = 0 beyond the "
            "second-longest length.",
        ),
    ] = True,
    allow_pickle: Annotated[
        bool, typer.Option("--allow-pickle", help="Allow pickled weights (pytorch_model.bin).")
    ] = False,
    trust_remote_code: Annotated[
        bool, typer.Option("--trust-remote-code", help="Allow model code shipped with the ckpt.")
    ] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print the summary as JSON.")] = False,
    quiet: Annotated[bool, typer.Option("--quiet", help="No progress bar.")] = False,
) -> None:
    """Realized energy of every response token: log-prob, Σπ², entropy, the logit-gradient
    proxy w = 1 − 2p + Σπ² (÷τ²) and its running sum W_t; the advantages each baseline gives;
    the forward-only variance proxies; and figures 3–5 of the OTB paper.

    Writes into --out: tokens.parquet, sequences.csv, groups.csv, proxies.json, summary.json and
    fig3/fig4/fig5 (+ fig_energy_by_step with several checkpoints) as PNG and PDF.

    Example: otb-diag energy --ckpt ./checkpoint-200 --rollouts rollouts.jsonl --out energy/
    """
    from otb_diag.checkpoint import find_checkpoints
    from otb_diag.defaults import DEFAULT_ROLLOUTS, default_checkpoint
    from otb_diag.energy_run import EnergySettings, format_summary, run_energy
    from otb_diag.inputs import LoadOptions

    rollouts_path = or_default(rollouts, DEFAULT_ROLLOUTS, "--rollouts")
    if model_free:
        if ckpt:
            note("--model-free given: ignoring --ckpt")
        checkpoints: list[Path] = []
    else:
        dirs = ckpt or [or_default(None, default_checkpoint(), "--ckpt")]
        checkpoints = [c for d in dirs for c in find_checkpoints(d)]
    settings = EnergySettings(
        baselines=tuple(b.strip() for b in baselines.split(",") if b.strip()),
        temperature=temperature,
        batch_tokens=batch_tokens,
        chunk_size=chunk_size,
        group=group,
        handle_zero_tail=handle_zero_tail,
        load=LoadOptions(device, dtype, allow_pickle, trust_remote_code),
    )
    summary = run_energy(checkpoints, rollouts_path, out, settings, progress=not quiet)
    if as_json:
        print_json(summary)
    else:
        typer.echo(format_summary(summary))
