"""The lab's policy: a small GPT-2 with an untied, bias-free output layer.

Untied because the diagnostics' exact output-layer gradient ``(e_y - pi) h^T`` assumes ``z = U h``
with ``U`` its own parameter; GPT-2's ``lm_head`` has no bias, so the formula is exact here.
"""

from __future__ import annotations

from transformers import GPT2Config, GPT2LMHeadModel, PreTrainedTokenizerFast


def build_model(
    tokenizer: PreTrainedTokenizerFast, n_embd: int, n_layer: int, n_head: int, n_positions: int
) -> GPT2LMHeadModel:
    """A freshly initialised model (draws from torch's global RNG: seed it first).

    Dropout is off: the lab trains briefly on unlimited fresh data, and it keeps training a pure
    function of the seed and the batches.
    """
    config = GPT2Config(
        vocab_size=len(tokenizer),
        n_positions=n_positions,
        n_embd=n_embd,
        n_layer=n_layer,
        n_head=n_head,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        tie_word_embeddings=False,
        bos_token_id=tokenizer.eos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    model = GPT2LMHeadModel(config)
    # Saved as generation_config.json, so `generate` on a reloaded checkpoint stops at <end>.
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.bos_token_id = tokenizer.eos_token_id
    return model


def n_params(model: GPT2LMHeadModel) -> int:
    """Number of parameters (tensors shared between modules counted once)."""
    return sum(p.numel() for p in model.parameters())
