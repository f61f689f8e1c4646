"""What every subcommand shares: turning bad input into one paragraph and a non-zero exit,
and saying out loud when the embedded default stands in for an omitted option."""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer

from otb_diag.errors import InputError
from otb_diag.io.atomic import json_text
from otb_diag.io.distributed import DistributedError

F = TypeVar("F", bound=Callable[..., Any])

EXIT_BAD_INPUT = 2
EXIT_FAULT = 1


def friendly_errors(fn: F) -> F:
    """Print an `InputError` as `otb-diag: error: ...` on stderr and exit 2, with no traceback.
    Under torchrun every rank raises the same error (`Dist.checked` shares a rank's own), so
    rank 0 alone prints it; a failed or lost rank (`DistributedError`) exits 1, said by every
    surviving rank."""

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

    return wrapper  # type: ignore[return-value]


def note(message: str) -> None:
    """Informational line on stderr, so stdout stays clean for `--json` (under torchrun by
    rank 0 only)."""
    if _is_rank_zero():
        typer.echo(message, err=True)


def _is_rank_zero() -> bool:
    return os.environ.get("RANK", "0") == "0"


def or_default(value: Path | None, default: Path, what: str) -> Path:
    """`value`, or the embedded default with a note saying it was used."""
    if value is not None:
        return value
    note(f"no {what} given: using the embedded default {default}")
    return default


def print_json(data: Any) -> None:
    typer.echo(json_text(data))


# Options shared by the commands that measure rollouts under checkpoints: declared once, so
# they read and behave the same everywhere.
CkptOption = Annotated[
    list[Path] | None,
    typer.Option(
        "--ckpt",
        metavar="DIR",
        help="Checkpoint directory (HF causal LM), repeatable; or a run directory holding "
        "checkpoint-* (HF Trainer/TRL) or global_step_* (verl) checkpoints. "
        "Default: the embedded final checkpoint.",
    ),
]
RolloutsOption = Annotated[
    Path | None,
    typer.Option("--rollouts", help="Rollouts file (JSONL/Parquet/verl dump). Default: embedded."),
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
JsonOption = Annotated[bool, typer.Option("--json", help="Print the summary as JSON.")]
QuietOption = Annotated[bool, typer.Option("--quiet", help="No progress bar.")]


def checkpoint_dirs(ckpt: list[Path] | None) -> list[Path]:
    """Every checkpoint the --ckpt options name (run directories expanded, oldest first), or
    the embedded final checkpoint, with a note, when none is given."""
    from otb_diag.io.checkpoint import find_checkpoints
    from otb_diag.io.defaults import default_checkpoint

    dirs = ckpt or [or_default(None, default_checkpoint(), "--ckpt")]
    return [c for d in dirs for c in find_checkpoints(d)]
