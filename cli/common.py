"""What every subcommand shares: turning bad input into one paragraph and a non-zero exit (and
any other failure into one paragraph, a saved traceback and exit 3), and saying out loud when the
embedded default stands in for an omitted option."""

from __future__ import annotations

import functools
import os
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, TypeVar

import click
import typer

from otb_diag.errors import InputError
from otb_diag.io.atomic import json_text
from otb_diag.runtime.torchrun import DistributedError

F = TypeVar("F", bound=Callable[..., Any])

EXIT_BAD_INPUT = 2
EXIT_FAULT = 1
EXIT_INTERNAL = 3
# `otb-diag --debug ...` (or OTB_DIAG_DEBUG=1) lets unexpected exceptions through with their
# traceback instead of the one-paragraph report.
DEBUG_ENV = "OTB_DIAG_DEBUG"
REPORT_URL = "the otb-diag issue tracker"


def debug_enabled() -> bool:
    return os.environ.get(DEBUG_ENV, "") not in ("", "0")


def friendly_errors(fn: F) -> F:
    """Print an `InputError` as `otb-diag: error: ...` on stderr and exit 2, with no traceback.
    Under torchrun every rank raises the same error (`Dist.checked` shares a rank's own), so
    rank 0 alone prints it; a failed or lost rank (`DistributedError`) exits 1, said by every
    surviving rank. Any other exception is one paragraph naming what failed and a file holding
    the full traceback, exit 3 (with --debug the exception propagates, traceback and all).
    Click's own exits pass through."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except InputError as err:
            if _is_rank_zero():
                typer.echo(f"otb-diag: error: {err}", err=True)
            raise typer.Exit(EXIT_BAD_INPUT) from None
        except DistributedError as err:
            typer.echo(f"otb-diag: error: {err}", err=True)
            raise typer.Exit(EXIT_FAULT) from None
        except (typer.Exit, typer.Abort, click.exceptions.Exit, click.ClickException, click.Abort):
            raise
        except Exception as err:
            if debug_enabled():
                raise
            typer.echo(internal_error_report(fn.__name__, err), err=True)
            raise typer.Exit(EXIT_INTERNAL) from None

    return wrapper  # type: ignore[return-value]


def internal_error_report(command: str, err: BaseException) -> str:
    """One paragraph for an unexpected exception: what failed, where the full traceback was
    saved (a new file in the temporary directory) and how to report it."""
    text = "".join(traceback.format_exception(type(err), err, err.__traceback__))
    try:
        fd, name = tempfile.mkstemp(
            prefix=f"otb-diag-{command}-{time.strftime('%Y%m%d-%H%M%S')}-", suffix=".txt"
        )
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
        saved = f"the full traceback is in {name}"
    except OSError as save_err:
        saved = f"the traceback could not be saved ({save_err})"
    summary = f"{type(err).__name__}: {err}".splitlines()[0][:300]
    return (
        f"otb-diag: internal error: '{command.replace('_', '-')}' failed unexpectedly "
        f"({summary}); {saved}. This is a bug in otb-diag, not in your input: please report "
        f"it on {REPORT_URL} with that file and the command line you ran; "
        f"`otb-diag --debug ...` (or {DEBUG_ENV}=1) shows the traceback here."
    )


def note(message: str) -> None:
    """Informational line on stderr, so stdout stays clean for `--json` (under torchrun by
    rank 0 only)."""
    if _is_rank_zero():
        typer.echo(message, err=True)


def _is_rank_zero() -> bool:
    return os.environ.get("RANK", "0") == "0"


def or_default(value: Path | None, default: Callable[[], Path], what: str) -> Path:
    """`value`, or the embedded default with a note saying it was used. `default` is called
    only then: finding a scenario's files fails when it is not shipped, which must not matter
    to a user who named their own."""
    if value is not None:
        return value
    path = default()
    note(f"no {what} given: using the embedded default {path}")
    return path


def print_json(data: Any) -> None:
    typer.echo(json_text(data))


# Options shared by the commands that measure rollouts under checkpoints: declared once, so
# they read and behave the same everywhere.
CkptOption = Annotated[
    list[Path] | None,
    typer.Option(
        "--ckpt",
        metavar="DIR",
        help="Checkpoint directory (HF causal LM) or .gguf file (needs otb-diag[gguf]), "
        "repeatable where a command measures several; or a run directory holding checkpoint-* "
        "(HF Trainer/TRL) or global_step_* (verl) checkpoints. Default: the embedded final "
        "checkpoint.",
    ),
]
RolloutsOption = Annotated[
    Path | None,
    typer.Option(
        "--rollouts",
        metavar="PATH",
        help="Rollouts: a file (JSONL/Parquet, verl dump, TRL completion log), a directory "
        "(verl's rollout_data_dir, a TRL output_dir; every *.jsonl/*.parquet in step order) or "
        "a quoted glob. Default: embedded.",
    ),
]
StepsOption = Annotated[
    str | None,
    typer.Option("--steps", metavar="A-B", help="Only rollout rows of training steps A to B."),
]
RewardColumnOption = Annotated[
    list[str] | None,
    typer.Option(
        "--reward-column",
        metavar="NAME",
        help="TRL completion logs: the reward column(s) to sum (repeatable). Default: every "
        "reward-function column.",
    ),
]
ChatTemplateOption = Annotated[
    bool,
    typer.Option(
        "--chat-template",
        help="Tokenize each text prompt as one user turn through the tokenizer's chat "
        "template, with the generation prompt (as chat trainers do).",
    ),
]
TemperatureOption = Annotated[
    float | None,
    typer.Option("--temperature", help="Sampling temperature τ; default: each row's own."),
]
DeviceOption = Annotated[
    str,
    typer.Option(
        "--device",
        help="auto (cuda, then mps, then cpu; the choice is said on stderr), cpu, cuda, cuda:1, "
        "mps. Under torchrun each rank takes cuda:<LOCAL_RANK>.",
    ),
]
DeviceMapOption = Annotated[
    str | None,
    typer.Option(
        "--device-map",
        help="Spread a checkpoint too large for one GPU over devices with accelerate: auto "
        "(every visible GPU, then CPU offload) or a list such as cuda:0,cuda:1,cpu. Replaces "
        "--device; not under torchrun.",
    ),
]
DtypeOption = Annotated[
    str, typer.Option("--dtype", help="auto (the checkpoint's), float32, bfloat16, float16.")
]
FullHashOption = Annotated[
    bool,
    typer.Option(
        "--full-hash",
        help="Hash every byte of each checkpoint for summary.json (default: a fingerprint of "
        "names, sizes, small files, safetensors headers and sampled blocks).",
    ),
]
BatchTokensOption = Annotated[
    int, typer.Option("--batch-tokens", help="Padded tokens per forward batch.")
]
ChunkSizeOption = Annotated[
    int, typer.Option("--chunk-size", help="Tokens whose [chunk, V] logits exist at once.")
]
ZeroTailOption = Annotated[
    bool,
    typer.Option(
        "--handle-zero-tail/--no-handle-zero-tail",
        help="verl's OTB option: a strictly longest member gets B_t = 0 beyond the "
        "second-longest length.",
    ),
]
AllowPickleOption = Annotated[
    bool, typer.Option("--allow-pickle", help="Allow pickled weights (pytorch_model.bin).")
]
RemoteCodeOption = Annotated[
    bool, typer.Option("--trust-remote-code", help="Allow model code shipped with the ckpt.")
]
JsonOption = Annotated[
    bool,
    typer.Option("--json", help="Print the summary as JSON on stdout instead of the text."),
]
OutOption = Annotated[
    Path, typer.Option("--out", metavar="DIR", help="Output directory (created).")
]
OutFileOption = Annotated[Path, typer.Option("--out", metavar="FILE", help="File to write.")]
QuietOption = Annotated[bool, typer.Option("--quiet", help="No progress bar.")]
ScenarioOption = Annotated[
    str,
    typer.Option(
        "--scenario",
        help="Embedded scenario, which also supplies an omitted --ckpt / --rollouts: default "
        "(copy, reverse, sort digits; responses of 4-45 tokens) or long (running sums with a "
        "written scratchpad; responses of 20-400 tokens, 16 prompts x 128).",
    ),
]


def checkpoint_dirs(ckpt: list[Path] | None, scenario: str = "default") -> list[Path]:
    """Every checkpoint the --ckpt options name (run directories expanded, oldest first), or
    the scenario's embedded final checkpoint, with a note, when none is given."""
    from otb_diag.io.checkpoint import find_checkpoints
    from otb_diag.io.scenarios import default_checkpoint

    dirs = ckpt or [or_default(None, lambda: default_checkpoint(scenario), "--ckpt")]
    return [c for d in dirs for c in find_checkpoints(d)]


def one_checkpoint(ckpt: list[Path] | None, why: str) -> Path | None:
    """The single --ckpt a command that uses one checkpoint was given (None when omitted); more
    than one is an `InputError` that says why only one is meaningful."""
    if ckpt and len(ckpt) > 1:
        names = ", ".join(str(c) for c in ckpt)
        raise InputError(
            f"{len(ckpt)} --ckpt given ({names}), but {why}: give one --ckpt", field="--ckpt"
        )
    return ckpt[0] if ckpt else None


def one_rollouts(positional: Path | None, option: Path | None) -> Path | None:
    """The rollouts named either positionally or by --rollouts (an alias); both, naming
    different paths, is an `InputError`."""
    if positional is not None and option is not None and positional != option:
        raise InputError(
            f"rollouts given twice, as {positional} and as --rollouts {option}: give one",
            field="--rollouts",
        )
    return option if option is not None else positional
