"""Find and load Hugging Face causal-LM checkpoints from local directories, refusing unsafe or
broken ones with one clear paragraph before transformers gets a chance to fail obscurely."""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from packaging.version import Version

from otb_diag.errors import InputError, json_problem
from otb_diag.io.load_options import DTYPES
from otb_diag.io.provenance import checkpoint_fingerprint
from otb_diag.runtime.devices import device_map_kwargs, resolve_device

if TYPE_CHECKING:  # transformers itself is imported where a checkpoint is read (seconds of
    # start-up that model-free commands do not pay)
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

_DTYPES: dict[str, torch.dtype | str] = {  # the --dtype names, each torch's dtype of its name
    name: "auto" if name == "auto" else getattr(torch, name) for name in DTYPES
}


def _dtype_kwarg() -> str:
    """transformers renamed `torch_dtype` to `dtype` in 4.56; the old name only warns in 5.x."""
    import transformers

    return "dtype" if Version(transformers.__version__) >= Version("4.56") else "torch_dtype"


# HF Trainer / TRL write `checkpoint-<n>`, verl writes `global_step_<n>`.
_STEP_DIR = re.compile(r"^(?:checkpoint-|global_step_)(\d+)$")

# Where verl puts the Hugging Face model inside `global_step_<n>`, in order of preference.
_VERL_MODEL_SUBDIRS = ("huggingface", "actor/huggingface", "actor")

# Files that carry a tokenizer vocabulary: fast, BPE, WordPiece, SentencePiece or tiktoken.
_TOKENIZER_PATTERNS = ("tokenizer.json", "vocab.json", "vocab.txt", "*.model", "*.tiktoken")

_MERGE_HINT = (
    "If this is a verl checkpoint, export the sharded actor with `python -m verl.model_merger "
    "merge --backend fsdp --local_dir <global_step_N>/actor --target_dir <dir>` and point at <dir>."
)


@dataclass
class Checkpoint:
    """A loaded checkpoint: the model in eval mode, its tokenizer and where it came from."""

    path: Path
    model: PreTrainedModel
    tokenizer: PreTrainedTokenizerBase
    step: int | None
    vocab_size: int
    dtype: torch.dtype
    device: torch.device


def checkpoint_record(ckpt: Checkpoint, full_hash: bool = False) -> dict[str, Any]:
    """Path, hash (`checkpoint_fingerprint`: what was hashed is said beside it) and step."""
    return {
        "path": str(ckpt.path), **checkpoint_fingerprint(ckpt.path, full=full_hash),
        "step": ckpt.step,
    }  # fmt: skip


def checkpoint_step(path: str | Path) -> int | None:
    """The training step in a `checkpoint-<n>` or `global_step_<n>` directory name, else None.

    The verl model subfolders (`huggingface`, `actor`) are skipped, so
    `global_step_5/actor/huggingface` gives 5.
    """
    path = Path(path)
    while path.name in ("huggingface", "actor") and path.parent != path:
        path = path.parent
    match = _STEP_DIR.match(path.name)
    return int(match.group(1)) if match else None


def find_checkpoints(path: str | Path) -> list[Path]:
    """The checkpoint directories at `path`, oldest first.

    `path` is either a checkpoint itself (it has `config.json`) or a run directory holding
    `checkpoint-<n>` (HF Trainer / TRL) or `global_step_<n>` (verl) subdirectories. For verl the
    model folder with a `config.json` among `huggingface`, `actor/huggingface` and `actor` is used.
    """
    root = Path(path)
    if _is_gguf(root):
        return [root]
    _require_directory(root)
    if (root / "config.json").is_file():
        return [root]
    found: list[tuple[int, Path]] = []
    for child in root.iterdir():
        match = _STEP_DIR.match(child.name)
        if not (match and child.is_dir()):
            continue
        model_dir = _verl_model_dir(child) if child.name.startswith("global_step_") else child
        found.append((int(match.group(1)), model_dir))
    if not found:
        raise InputError(
            "is neither a checkpoint (no config.json) nor a run directory holding "
            "checkpoint-<n> (HF Trainer/TRL) or global_step_<n> (verl) subdirectories.",
            path=root,
            hint="Point at one checkpoint directory or at the training output directory.",
        )
    return [model_dir for _, model_dir in sorted(found)]


def load_checkpoint(
    path: str | Path,
    *,
    device: str | torch.device = "cpu",
    device_map: str | None = None,
    dtype: str | torch.dtype | None = None,
    allow_pickle: bool = False,
    trust_remote_code: bool = False,
) -> Checkpoint:
    """Load the causal LM and tokenizer saved in the local directory `path`.

    `dtype` is "auto" (the checkpoint's own dtype, also what None means), "float32", "bfloat16",
    "float16" or a `torch.dtype`. Pickled weights (`pytorch_model*.bin`) are refused unless
    `allow_pickle`, and checkpoints that ship their own modelling code unless `trust_remote_code`.
    Nothing is ever downloaded. Raises `InputError` for every problem with the directory.
    `device` is one device (`auto`: see `devices.resolve_device`); `device_map` (`auto` or a
    list of devices) spreads the model over GPUs and CPU offload with accelerate instead.
    """
    target = resolve_device(str(device)) if device_map is None else None
    placement = device_map_kwargs(device_map)
    root = Path(path).resolve()
    if _is_gguf(root):
        weights: dict[str, Any] = _gguf_kwargs(root)
        source = root.parent
    else:
        _require_directory(root)
        _check_config(root, trust_remote_code)
        weights = {"use_safetensors": _check_weights(root, allow_pickle)}
        _check_tokenizer_files(root)
        source = root

    from transformers import AutoModelForCausalLM

    with no_transformers_progress_bars():
        model = AutoModelForCausalLM.from_pretrained(
            source,
            local_files_only=True,
            trust_remote_code=trust_remote_code,
            **weights,
            **placement,
            **{_dtype_kwarg(): _resolve_dtype(dtype)},
        )
    model = (model if target is None else model.to(target)).eval()
    if _is_gguf(root):
        _forget_gguf_quantizer(model)
    if model.get_output_embeddings().weight.device.type == "meta":
        raise InputError(
            f"--device-map {device_map}: the output layer was offloaded to disk, but the "
            "statistics read its weights directly.",
            path=root,
            field="device-map",
            hint="Give the GPUs or the CPU room for it (add cpu to the list).",
        )
    vocab_size = model.get_output_embeddings().weight.shape[0]
    tokenizer = _load_matching_tokenizer(root, vocab_size, trust_remote_code)
    return Checkpoint(
        path=root,
        model=model,
        tokenizer=tokenizer,
        step=checkpoint_step(root),
        vocab_size=vocab_size,
        dtype=model.dtype,
        device=model.device,
    )


def _forget_gguf_quantizer(model: PreTrainedModel) -> None:
    """A model read from a GGUF file holds de-quantized float weights, yet transformers keeps
    the GGUF quantizer on it and then refuses `save_pretrained` ("quantized with gguf and is
    not serializable": `train --ckpt model.gguf` failed at its first checkpoint). Dropped, the
    model is what it is, a float model, and saves as one."""
    model.__dict__.pop("hf_quantizer", None)
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config


@contextlib.contextmanager
def no_transformers_progress_bars() -> Iterator[None]:
    """transformers' per-file loading bars off (our commands draw their own), then restored."""
    from transformers.utils import logging as hf_logging

    enabled = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if enabled:
            hf_logging.enable_progress_bar()


def load_tokenizer(
    path: str | Path, *, trust_remote_code: bool = False
) -> tuple[PreTrainedTokenizerBase, int]:
    """The tokenizer of the checkpoint at `path` and the model's vocabulary size (from its config),
    without loading the weights: enough to tokenize and bound-check rollouts."""
    root = Path(path).resolve()
    if _is_gguf(root):
        source, extra = root.parent, _gguf_kwargs(root)
    else:
        _require_directory(root)
        _check_config(root, trust_remote_code)
        _check_tokenizer_files(root)
        source, extra = root, {}
    from transformers import AutoConfig

    with no_transformers_progress_bars():
        config = AutoConfig.from_pretrained(
            source, local_files_only=True, trust_remote_code=trust_remote_code, **extra
        )
    vocab_size = int(config.get_text_config().vocab_size)
    return _load_matching_tokenizer(root, vocab_size, trust_remote_code), vocab_size


def _load_matching_tokenizer(
    root: Path, vocab_size: int, trust_remote_code: bool
) -> PreTrainedTokenizerBase:
    from transformers import AutoTokenizer

    source, extra = (root.parent, _gguf_kwargs(root)) if _is_gguf(root) else (root, {})
    with no_transformers_progress_bars():
        tokenizer = AutoTokenizer.from_pretrained(
            source, local_files_only=True, trust_remote_code=trust_remote_code, **extra
        )
    if len(tokenizer) > vocab_size:
        raise InputError(
            f"tokenizer does not match the checkpoint: it has {len(tokenizer)} tokens but the "
            f"model's output embeddings have only {vocab_size} rows.",
            path=root,
            hint="Save the tokenizer the model was trained with into this directory.",
        )
    return tokenizer


def _is_gguf(path: Path) -> bool:
    """Whether `path` names a GGUF file (llama.cpp's single-file format) rather than a directory."""
    return path.suffix.lower() == ".gguf" and not path.is_dir()


def _gguf_kwargs(path: Path) -> dict[str, Any]:
    """`from_pretrained` arguments for the GGUF file `path` (loaded from its folder with
    `gguf_file=`; transformers de-quantizes it to a float model); `InputError` when the file is
    missing or the optional `gguf` package is not installed."""
    import importlib.util

    if not path.is_file():
        raise InputError("GGUF checkpoint file does not exist.", path=path)
    if importlib.util.find_spec("gguf") is None:
        raise InputError(
            "is a GGUF checkpoint, and transformers reads GGUF files only with the gguf package, "
            "which is not installed.",
            path=path,
            hint="Install it with `pip install 'otb-diag[gguf]'` (or `pip install gguf`), or "
            "point at a Hugging Face checkpoint directory instead.",
        )
    return {"gguf_file": path.name}


def _require_directory(path: Path) -> None:
    if not path.exists():
        raise InputError("checkpoint directory does not exist.", path=path)
    if not path.is_dir():
        raise InputError(
            "is a file, not a checkpoint directory.",
            path=path,
            hint="Point at the directory holding config.json, the weights and the tokenizer.",
        )


def _verl_model_dir(step_dir: Path) -> Path:
    """The subfolder of a verl `global_step_<n>` that holds the Hugging Face model."""
    for sub in _VERL_MODEL_SUBDIRS:
        if (step_dir / sub / "config.json").is_file():
            return step_dir / sub
    raise InputError(
        "verl step directory has no Hugging Face model: no config.json in "
        + ", ".join(f"{sub}/" for sub in _VERL_MODEL_SUBDIRS)
        + ".",
        path=step_dir,
        hint=_MERGE_HINT,
    )


def _check_config(root: Path, trust_remote_code: bool) -> None:
    """config.json exists, parses, and names an architecture this transformers can build."""
    import transformers
    from transformers import CONFIG_MAPPING

    config_path = root / "config.json"
    if not config_path.is_file():
        raise InputError(
            "no config.json: this is not a Hugging Face model directory.",
            path=root,
            hint="For a run directory, use find_checkpoints() to list its checkpoints.",
        )
    try:
        config: Any = json.loads(config_path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as err:
        raise InputError(
            f"config.json is not valid JSON ({json_problem(err)}).",
            path=config_path,
            line=err.lineno,
        ) from None
    if not isinstance(config, dict):
        raise InputError("config.json must hold a JSON object.", path=config_path)

    if trust_remote_code:
        return
    if "auto_map" in config:
        raise InputError(
            "the checkpoint ships its own modelling code (auto_map in config.json), and running "
            "it means executing Python from the checkpoint directory.",
            path=config_path,
            hint="Pass trust_remote_code=True (--trust-remote-code) only if you trust its source.",
        )
    model_type = config.get("model_type")
    if model_type not in CONFIG_MAPPING:
        raise InputError(
            f"model_type {model_type!r} is unknown to transformers {transformers.__version__}.",
            path=config_path,
            field="model_type",
            hint="Upgrade transformers, or pass trust_remote_code=True (--trust-remote-code) if "
            "the checkpoint ships its own modelling code and you trust its source.",
        )


def _check_weights(root: Path, allow_pickle: bool) -> bool:
    """Whether the weights are safetensors; raises if there are none or only pickled ones."""
    if any(root.glob("*.safetensors")) or (root / "model.safetensors.index.json").is_file():
        return True
    if any(root.glob("pytorch_model*.bin")):
        if allow_pickle:
            return False
        raise InputError(
            "has only pickled weights (pytorch_model*.bin). Unpickling a file can run arbitrary "
            "code, so they are refused by default.",
            path=root,
            hint="Convert them to safetensors, or pass allow_pickle=True (--allow-pickle) if you "
            "trust their source.",
        )
    # Trainer state (optimizer.pt, training_args.bin) and FSDP shards (*.pt) are not a model.
    raise InputError(
        "no model weights: expected *.safetensors, model.safetensors.index.json or "
        "pytorch_model*.bin.",
        path=root,
        hint=_MERGE_HINT,
    )


def _check_tokenizer_files(root: Path) -> None:
    if any(any(root.glob(pattern)) for pattern in _TOKENIZER_PATTERNS):
        return
    raise InputError(
        "no tokenizer files: expected one of " + ", ".join(_TOKENIZER_PATTERNS) + ".",
        path=root,
        hint="Save the tokenizer next to the model (tokenizer.save_pretrained); for verl, "
        "global_step_<n>/actor/huggingface holds it.",
    )


def _resolve_dtype(dtype: str | torch.dtype | None) -> torch.dtype | str:
    if dtype is None:
        # Spelled out so transformers 4.x (float32 by default) behaves like 5.x ("auto").
        return "auto"
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype not in _DTYPES:
        raise InputError(
            f"unknown dtype {dtype!r}.", hint="Use one of: " + ", ".join(_DTYPES) + "."
        )
    return _DTYPES[dtype]
