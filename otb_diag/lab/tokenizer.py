"""A character-level tokenizer for the lab task, saved and loaded like any Hugging Face tokenizer.

Every character of the task alphabet is one token, and the markers ``<end>`` (the eos token, so
``generate`` stops on it) and ``<call>`` are one token each. Because no token spans two characters,
``encode(prompt) + encode(response) == encode(prompt + response)``: rollouts can be tokenized in
pieces. The ``Fuse`` decoder joins tokens without spaces, so decoding is the exact inverse of
encoding. ``<end>`` is a special token: decode with the default ``skip_special_tokens=False`` to
keep it in the text (the lab always does).
"""

from __future__ import annotations

from tokenizers import AddedToken, Tokenizer, decoders, models
from transformers import PreTrainedTokenizerFast

from otb_diag.lab.task import ANSWER, CALL, END, LABELS

PAD = "<pad>"
UNK = "<unk>"
ALPHABET = "0123456789CRST:=[]"  # the default scenario's characters
LONG_ALPHABET = f"0123456789:+=;{ANSWER}{LABELS}"  # the long scenario (op A is a label)


def build_tokenizer(alphabet: str = ALPHABET) -> PreTrainedTokenizerFast:
    """The lab tokenizer: ids 0-3 for pad, unk, end, call, then one id per alphabet character."""
    if len(set(alphabet)) != len(alphabet):
        raise ValueError(f"repeated characters in the alphabet {alphabet!r}")
    tokens = [PAD, UNK, END, CALL, *alphabet]
    vocab = {token: i for i, token in enumerate(tokens)}
    # BPE without merges and without a pre-tokenizer is exactly "one token per character".
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token=UNK))
    backend.decoder = decoders.Fuse()
    # Multi-character markers must be matched before the character split.
    backend.add_special_tokens([AddedToken(t, special=True) for t in (PAD, UNK, END)])
    backend.add_tokens([AddedToken(CALL, special=False)])
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        eos_token=END,
        pad_token=PAD,
        unk_token=UNK,
        clean_up_tokenization_spaces=False,
    )
