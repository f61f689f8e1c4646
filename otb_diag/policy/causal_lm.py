"""The causal LM a policy's passes run: the model itself, or the one inside a PEFT wrapper.

`peft.get_peft_model(model, LoraConfig(...))` (what TRL's `GRPOTrainer(peft_config=...)` trains)
returns a `PeftModel` two levels above the Hugging Face causal LM: its `base_model` is the
tuner (`LoraModel`), whose forward returns the logits, and the backbone that returns hidden
states is `base_model.model.base_model`. A pass that read `model.base_model` as the backbone
took the logits for hidden states (issue 52: `mat1 and mat2 shapes cannot be multiplied (8x22
and 128x22)` in the output layer's check, under `attach(trainer, advantages="otb")`).

The tuners that inject their layers into the model (LoRA and its kin, IA³, …) leave inside it
a causal LM, `get_base_model()`, whose forward with the adapter active is the wrapper's, to the
bit: every public entry of `policy/` runs that one (`causal_lm`), so its backbone, its output
layer and its parameters are found as in a plain model, and a LoRA policy's statistics and
head-mode scores are those of its merged weights. A prompt-learning adapter (prompt tuning,
prefix tuning, p-tuning) adds virtual tokens in the wrapper's own forward, which the causal LM
inside never sees: refused. A model with an adapter loaded by transformers itself
(`model.load_adapter`) is the causal LM already, its layers adapted in place.
"""

from __future__ import annotations

from torch import nn

from otb_diag.errors import InputError


def causal_lm(model: nn.Module) -> nn.Module:
    """`model`, or the causal LM inside it when it is a PEFT wrapper (a `peft.PeftModel`: a
    `peft_config` and `get_base_model()`); an `InputError` for a prompt-learning adapter."""
    get_base_model = getattr(model, "get_base_model", None)
    if getattr(model, "peft_config", None) is None or not callable(get_base_model):
        return model
    config = getattr(model, "active_peft_config", None)
    if getattr(config, "is_prompt_learning", False):
        kind = getattr(config.peft_type, "value", config.peft_type)  # PeftType.X -> "X"
        raise InputError(
            f"the PEFT adapter of this model ({kind}) adds virtual tokens in the wrapper's "
            "forward, which otb-diag's passes, run on the causal LM inside it, would not see.",
            hint="Use an adapter that adapts the model's layers (LoRA and its kin, IA3, ...).",
        )
    return get_base_model()
