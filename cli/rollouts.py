"""`otb-diag rollouts`: read, validate and summarise a rollouts file."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
from otb_diag.cli.common import (
    AllowPickleOption,
    BatchTokensOption,
    ChatTemplateOption,
    CkptOption,
    DeviceOption,
    DtypeOption,
    JsonOption,
    OutOption,
    QuietOption,
    RemoteCodeOption,
    RewardColumnOption,
    RolloutsOption,
    ScenarioOption,
    StepsOption,
    friendly_errors,
    note,
    one_checkpoint,
    one_rollouts,
    or_default,
    print_json,
)

app = typer.Typer(
    rich_markup_mode=None,  # reflow docstring paragraphs to the terminal's width
    no_args_is_help=True,
    help="Sample pools from a checkpoint; read, validate and summarise rollouts.\n\n"
    "Example: otb-diag rollouts inspect rollouts.jsonl --ckpt ./checkpoint-200",
)


@app.command("inspect")
@friendly_errors
def inspect(
    file: Annotated[
        Path | None,
        typer.Argument(
            metavar="PATH",
            help="Rollouts, as --rollouts (an alias: give either form).",
        ),
    ] = None,
    rollouts: RolloutsOption = None,
    ckpt: CkptOption = None,
    as_json: JsonOption = False,
    trust_remote_code: RemoteCodeOption = False,
    steps: StepsOption = None,
    reward_column: RewardColumnOption = None,
    chat_template: ChatTemplateOption = False,
    scenario: ScenarioOption = "default",
) -> None:
    """What to check first in a rollouts file: rows, groups and their sizes, response lengths,
    rewards, the share of groups whose rewards are all equal (no signal under a group baseline)
    and the share of masked (tool-output) tokens. Every row is validated; bad input stops with the
    file, line and field. --ckpt (one; its tokenizer tokenizes text-only rows and its vocabulary
    bounds the token ids) defaults to the embedded checkpoint when one is needed.

    Example: otb-diag rollouts inspect rollouts.jsonl --ckpt ./checkpoint-200 --json

    (the same: otb-diag rollouts inspect --rollouts rollouts.jsonl --ckpt ./checkpoint-200 --json)
    """
    from otb_diag.io.scenarios import default_checkpoint, default_rollouts
    from otb_diag.pipelines.inspect.recipe import format_summary, inspect_rollouts

    given_ckpt = one_checkpoint(ckpt, "inspect reads one tokenizer")
    given_rollouts = one_rollouts(file, rollouts)

    def tokenizer() -> tuple[Any, int]:
        from otb_diag.io.checkpoint import load_tokenizer

        ckpt_dir = or_default(given_ckpt, lambda: default_checkpoint(scenario), "checkpoint")
        return load_tokenizer(ckpt_dir, trust_remote_code=trust_remote_code)

    path = or_default(given_rollouts, lambda: default_rollouts(scenario), "rollouts file")
    result = inspect_rollouts(
        path,
        tokenizer,
        always_tokenizer=given_ckpt is not None or given_rollouts is None,
        steps=steps,
        reward_columns=reward_column,
        chat_template=chat_template,
    )
    if result is None:  # a rank other than 0 under torchrun: rank 0 prints
        return
    summary, issues = result.summary, result.issues
    if result.untemplated:
        note(
            f"note: {result.untemplated} prompts were tokenized without the tokenizer's chat "
            "template; pass --chat-template if the trainer applied it"
        )
    summary["round_trip_issues"] = [str(issue) for issue in issues]
    if as_json:
        print_json(summary)
        return
    typer.echo(format_summary(summary))
    for issue in issues[:10]:
        note(f"round trip: {issue}")
    if len(issues) > 10:
        note(f"... and {len(issues) - 10} more rows whose text does not round-trip")


@app.command("sample")
@friendly_errors
def sample(
    prompts: Annotated[
        Path,
        typer.Option(
            "--prompts",
            metavar="FILE",
            help="Prompts: JSONL, Parquet, CSV, or a datasets save_to_disk directory; a prompt "
            "is text or a list of chat messages.",
        ),
    ],
    out: OutOption,
    ckpt: CkptOption = None,
    n: Annotated[int, typer.Option("--n", help="Responses per prompt (the pool size M).")] = 64,
    prompt_column: Annotated[
        str, typer.Option("--prompt-column", help="Column holding the prompt.")
    ] = "prompt",
    answer_column: Annotated[
        str | None,
        typer.Option(
            "--answer-column", help="Column holding the answer. Default: 'answer' when present."
        ),
    ] = None,
    verifier: Annotated[
        str,
        typer.Option(
            "--verifier",
            help="Reward: exact, contains, last-number[:TOL], boxed, regex:PATTERN, math "
            "(needs otb-diag[math]), or a function file.py:fn / module:fn called as "
            "fn(prompt, response, answer) -> float.",
        ),
    ] = "last-number",
    temperature: Annotated[
        float,
        typer.Option("--temperature", help="Sampling temperature τ (the policy is softmax(z/τ))."),
    ] = 1.0,
    top_p: Annotated[
        float, typer.Option("--top-p", help="Nucleus truncation (1 = off; recorded and flagged).")
    ] = 1.0,
    top_k: Annotated[
        int, typer.Option("--top-k", help="Top-k truncation (0 = off; recorded and flagged).")
    ] = 0,
    max_new_tokens: Annotated[
        int, typer.Option("--max-new-tokens", help="Longest response, EOS included.")
    ] = 128,
    seed: Annotated[
        int, typer.Option("--seed", help="Seed; each response draws from (seed, prompt, index).")
    ] = 0,
    no_chat_template: Annotated[
        bool,
        typer.Option(
            "--no-chat-template",
            help="Tokenize text prompts as they are, even when the tokenizer has a chat template.",
        ),
    ] = False,
    batch_tokens: BatchTokensOption = 32768,
    resume: Annotated[
        bool, typer.Option("--resume", help="Finish a killed run into the same --out.")
    ] = False,
    device: DeviceOption = "auto",
    dtype: DtypeOption = "auto",
    allow_pickle: AllowPickleOption = False,
    trust_remote_code: RemoteCodeOption = False,
    quiet: QuietOption = False,
    as_json: JsonOption = False,
) -> None:
    """Sample pools of --n responses per prompt from a checkpoint (a Hugging Face directory or a
    .gguf file), score them with a verifier and write them in the rollout format: OUT/rollouts.jsonl
    (one group per prompt, exact prompt_ids and response_ids, EOS kept, a truncated flag, and
    per-token logprobs and sum_pi2 under softmax(z/τ)) and OUT/manifest.json (every setting).
    energy, variance-compare and rollouts inspect read OUT as it is. Pools of M ≥ 64 let
    variance-compare measure N′ up to 32. Each response is a function of (--seed, prompt,
    index): a killed run finished with --resume writes exactly the pools of an uninterrupted one.
    Under torchrun the ranks split the prompts and write the pools of one process.

    Example: otb-diag rollouts sample --ckpt ./checkpoint-200 --prompts prompts.jsonl --n 64
    --max-new-tokens 128 --verifier math --out pools/
    """
    from otb_diag.io.loading import LoadOptions
    from otb_diag.io.scenarios import default_checkpoint
    from otb_diag.pipelines.sample.recipe import SampleSettings, run_sample
    from otb_diag.policy.sampling import Sampling

    given = one_checkpoint(ckpt, "sample draws from one policy")
    path = or_default(given, lambda: default_checkpoint("default"), "--ckpt")
    settings = SampleSettings(
        n=n,
        sampling=Sampling(temperature, top_k, top_p, max_new_tokens),
        seed=seed,
        verifier=verifier,
        prompt_column=prompt_column,
        answer_column=answer_column,
        chat_template=not no_chat_template,
        batch_tokens=batch_tokens,
        load=LoadOptions(
            device=device,
            dtype=dtype,
            allow_pickle=allow_pickle,
            trust_remote_code=trust_remote_code,
        ),
    )
    manifest = run_sample(path, prompts, out, settings, resume=resume, progress=not quiet, say=note)
    if manifest is None:  # a rank other than 0 under torchrun: rank 0 reports
        return
    if as_json:
        print_json(manifest)
        return
    typer.echo(
        f"sampled {manifest['responses']} responses to {manifest['prompts_count']} prompts "
        f"({manifest['generated_tokens']} tokens, {manifest['truncated']} truncated) in "
        f"{manifest['seconds']:.1f} s; mean reward {manifest['mean_reward']:.3f}\n"
        f"wrote {out / 'rollouts.jsonl'} and {out / 'manifest.json'}"
    )
