"""A tiny random GPT-2 and a character-level tokenizer, saved the way real checkpoints are."""

from __future__ import annotations

from pathlib import Path

import torch
from tokenizers import Regex, Tokenizer, models, pre_tokenizers
from transformers import (
    Gemma2Config,
    Gemma2ForCausalLM,
    GPT2Config,
    GPT2LMHeadModel,
    PreTrainedTokenizerFast,
)

MODEL_VOCAB = 30


def char_tokenizer(n_letters: int = 26) -> PreTrainedTokenizerFast:
    """WordLevel over single characters: <unk>, <eos>, space and the first `n_letters` letters."""
    chars = [" "] + [chr(ord("a") + i) for i in range(n_letters)]
    vocab = {"<unk>": 0, "<eos>": 1, **{c: i + 2 for i, c in enumerate(chars)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", eos_token="<eos>")


def tiny_model(seed: int = 0, n_positions: int = 32) -> GPT2LMHeadModel:
    torch.manual_seed(seed)
    config = GPT2Config(
        vocab_size=MODEL_VOCAB,
        n_embd=16,
        n_layer=1,
        n_head=2,
        n_positions=n_positions,
        bos_token_id=1,
        eos_token_id=1,
        tie_word_embeddings=False,
    )
    return GPT2LMHeadModel(config).eval()


def save_checkpoint(directory: Path, seed: int = 0, n_positions: int = 32) -> GPT2LMHeadModel:
    """Save a tiny model and its tokenizer into `directory`; returns the model."""
    model = tiny_model(seed, n_positions)
    model.save_pretrained(directory)
    char_tokenizer().save_pretrained(directory)
    return model


def soft_capped_gemma2(vocab: int, seed: int = 0) -> Gemma2ForCausalLM:
    """A one-layer random Gemma-2 over `vocab` tokens, untied, with a final logit soft-cap tight
    enough to matter (c = 0.5), in eval mode."""
    torch.manual_seed(seed)
    config = Gemma2Config(
        vocab_size=vocab, hidden_size=8, intermediate_size=16, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=2, head_dim=4, tie_word_embeddings=False,
        final_logit_softcapping=0.5,
    )  # fmt: skip
    return Gemma2ForCausalLM(config).eval()
