"""The one sampler with torch's global RNG (`GlobalRng`) draws exactly what Hugging Face's
`generate(do_sample=True, temperature=τ, top_k=0, top_p=1)` drew: the embedded labs and `train`'s
runs, sampled that way before the samplers were merged, stay bit-identical.

`hf_do_sample_continuations` is the lab's former sampler (`otb_diag/lab/sample.py` before it
went), kept here only as the reference."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, GPT2Config, GPT2LMHeadModel

import otb_diag.lab.rollouts as lab_rollouts
from otb_diag.io.scenarios import default_checkpoint
from otb_diag.lab.rollouts import sample_continuations, sample_groups, sample_tool_responses
from otb_diag.lab.task import TOOL_OP, make_problem


def hf_do_sample_continuations(
    model: torch.nn.Module,
    contexts: list[list[int]],
    *,
    temperature: float,
    max_new_tokens: int,
    stop_ids: list[int],
    pad_id: int,
) -> list[list[int]]:
    """The former lab sampler, verbatim: `generate(do_sample=True)` from the global RNG."""
    width = max(len(c) for c in contexts)
    input_ids = torch.tensor([[pad_id] * (width - len(c)) + c for c in contexts])  # [B, P]
    attention_mask = torch.tensor([[0] * (width - len(c)) + [1] * len(c) for c in contexts])
    with torch.no_grad():
        out = model.generate(
            input_ids=input_ids,
            attention_mask=attention_mask,
            do_sample=True,
            temperature=temperature,
            top_k=0,
            top_p=1.0,
            max_new_tokens=max_new_tokens,
            eos_token_id=stop_ids,
            pad_token_id=pad_id,
        )  # [B, P + L]
    continuations = []
    for row in out[:, input_ids.shape[1] :].tolist():
        stop = next((i for i, t in enumerate(row) if t in stop_ids), None)
        continuations.append(row if stop is None else row[: stop + 1])
    return continuations


@pytest.fixture(scope="module")
def lab():
    path = default_checkpoint()
    return AutoModelForCausalLM.from_pretrained(path).eval(), AutoTokenizer.from_pretrained(path)


def both(fn_kwargs: dict, seed: int, model: torch.nn.Module, contexts: list[list[int]]):
    """(reference, ours) from the same global RNG state; also checks both leave it the same."""
    results, states = [], []
    for fn in (hf_do_sample_continuations, sample_continuations):
        torch.manual_seed(seed)
        results.append(fn(model, contexts, **fn_kwargs))
        states.append(torch.get_rng_state())
    assert torch.equal(states[0], states[1])  # the same number of draws: later calls agree too
    return results


@pytest.mark.parametrize("temperature", [1.0, 0.7, 1.3])
@pytest.mark.parametrize("seed", [0, 1, 2026])
def test_lab_checkpoint_draws_what_hf_drew(lab, seed: int, temperature: float) -> None:
    model, tok = lab
    prompts = ["C:684=", "R:096=", "S:2753=", "C:123456789=", "S:3=", "R:0987654321="]
    contexts = [tok.encode(p, add_special_tokens=False) for p in prompts]  # unequal: padded
    kwargs = dict(
        temperature=temperature,
        max_new_tokens=24,
        stop_ids=[tok.eos_token_id],
        pad_id=tok.pad_token_id,
    )
    for batch in (contexts[:1], contexts[:2], contexts * 3):  # one row, equal lengths, padded
        reference, ours = both(kwargs, seed, model, batch)
        assert ours == reference


@pytest.mark.parametrize("seed", [0, 5])
def test_random_model_with_a_larger_vocabulary_draws_what_hf_drew(seed: int) -> None:
    torch.manual_seed(100 + seed)
    config = GPT2Config(vocab_size=3000, n_positions=64, n_embd=32, n_layer=2, n_head=2)
    model = GPT2LMHeadModel(config).eval()
    contexts = [[5, 6, 7], [8, 9], [10, 11, 12, 13, 14], [1]]
    kwargs = dict(temperature=0.9, max_new_tokens=12, stop_ids=[17, 29], pad_id=0)
    reference, ours = both(kwargs, seed, model, contexts)
    assert ours == reference


def test_tool_use_and_groups_draw_what_hf_drew(lab, monkeypatch: pytest.MonkeyPatch) -> None:
    """The multi-turn TIR path and whole groups (one padded batch, and group by group), with the
    former sampler patched in as the reference."""
    model, tok = lab
    rng = np.random.default_rng(3)
    tool = [make_problem(rng, TOOL_OP, n).prompt for n in (3, 5, 8, 9)]
    plain = ["C:684=", "S:27530=", "R:096="]

    def run() -> tuple:
        torch.manual_seed(11)
        tir = sample_tool_responses(model, tok, tool * 2, temperature=1.0, max_new_tokens=112)
        together = sample_groups(
            model, tok, plain, group_size=4, temperature=1.0, max_new_tokens=32, step=7,
            together=True,
        )  # fmt: skip
        apart = sample_groups(
            model, tok, plain, group_size=4, temperature=0.8, max_new_tokens=32, step=7
        )
        return tir, together, apart, torch.get_rng_state()

    ours = run()
    with monkeypatch.context() as patch:
        patch.setattr(lab_rollouts, "sample_continuations", hf_do_sample_continuations)
        reference = run()
    assert any(0 in mask for _, mask in ours[0])  # a tool was called: several turns ran
    assert ours[:3] == reference[:3]
    assert torch.equal(ours[3], reference[3])
