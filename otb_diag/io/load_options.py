"""How checkpoints are loaded and text prompts tokenized: the options every command that loads a
checkpoint shares, declared once (no torch at import: the command line is built from them)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from otb_diag.errors import InputError
from otb_diag.knobs import Checked, knob, one_of

if TYPE_CHECKING:
    from otb_diag.io.checkpoint import Checkpoint


DTYPES = ("auto", "float32", "bfloat16", "float16")  # auto: the checkpoint's own


@dataclass(frozen=True)
class LoadOptions(Checked):
    """How checkpoints are loaded (the CLI's --device, --dtype, safety flags and --device-map)
    and how text prompts are tokenized (--chat-template)."""

    device: str = knob(
        "auto",
        help="auto (cuda, then mps, then cpu; the choice is said on stderr), cpu, cuda, cuda:1, "
        "mps. Under torchrun each rank takes cuda:<LOCAL_RANK>.",
    )
    dtype: str = knob(
        "auto", one_of(DTYPES), help="auto (the checkpoint's), float32, bfloat16, float16."
    )
    allow_pickle: bool = knob(False, help="Allow pickled weights (pytorch_model.bin).")
    trust_remote_code: bool = knob(False, help="Allow model code shipped with the ckpt.")
    chat_template: bool = knob(
        False,
        help="Tokenize each text prompt as one user turn through the tokenizer's chat "
        "template, with the generation prompt (as chat trainers do).",
    )
    device_map: str | None = knob(
        None,
        help="Spread a checkpoint too large for one GPU over devices with accelerate: auto "
        "(every visible GPU, then CPU offload) or a list such as cuda:0,cuda:1,cpu. Replaces "
        "--device; not under torchrun.",
    )
    full_hash: bool = knob(
        False,
        help="Hash every byte of each checkpoint for summary.json (default: a fingerprint of "
        "names, sizes, small files, safetensors headers and sampled blocks).",
    )

    def check(self, world_size: int | None = None) -> None:
        """Raise `InputError` now, before anything is read or written (the recipe shell's first
        step), for a device this machine does not have, or a --device-map under torchrun
        (`world_size` ranks, each loading a whole model on its own GPU; None: as many as
        torchrun launched)."""
        from otb_diag.runtime.devices import device_map_kwargs, resolve_device
        from otb_diag.runtime.torchrun import launched_world_size

        world_size = launched_world_size() if world_size is None else world_size

        if self.device_map is None:
            resolve_device(self.device)
            return
        device_map_kwargs(self.device_map)
        if world_size > 1:
            raise InputError(
                "--device-map spreads one model over the GPUs of one process; under torchrun "
                "every rank loads a whole model on its own GPU.",
                field="device-map",
                hint="Use one or the other.",
            )

    def load(self, path: Path) -> Checkpoint:
        """The checkpoint at `path`, loaded as these options say."""
        from otb_diag.io.checkpoint import load_checkpoint

        return load_checkpoint(
            path,
            device=self.device,
            device_map=self.device_map,
            dtype=self.dtype,
            allow_pickle=self.allow_pickle,
            trust_remote_code=self.trust_remote_code,
        )
