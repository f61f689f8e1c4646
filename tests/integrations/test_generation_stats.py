"""log p and Σπ² caught from `generate`'s own forwards (`generation_stats.py`) are those of a
full forward over the sampled sequences at the sampling temperature, in fp32 under autocast
too; a forward without logits leaves no stats, and `attach(advantages="otb")` then takes one
extra forward (`otb/advantages/extra_forward` = 1) and trains with the same advantages."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from otb_diag.integrations.core.generation_stats import GenerationStats
from otb_diag.io.scenarios import default_checkpoint

TAU = 0.7


def sampled(model: torch.nn.Module, stats: GenerationStats) -> tuple[torch.Tensor, int]:
    """Four sampled continuations of two equal-length prompts (no padding), 6 new tokens."""
    torch.manual_seed(3)
    prompts = torch.tensor([[5, 6, 7, 8], [9, 10, 11, 12]])
    out = model.generate(
        input_ids=prompts, attention_mask=torch.ones_like(prompts), do_sample=True,
        temperature=TAU, top_k=0, max_new_tokens=6, min_new_tokens=6, num_return_sequences=2,
        pad_token_id=0,
    )  # fmt: skip
    return out, prompts.shape[1]


def full_forward(model: torch.nn.Module, sequences: torch.Tensor, start: int):
    """log p and Σπ² `[B, C]` of the tokens after `start` from one forward, at τ."""
    with torch.no_grad():
        logits = model(input_ids=sequences).logits[:, start - 1 : -1].float() / TAU
    log_pi = logits.log_softmax(-1)
    token = log_pi.gather(-1, sequences[:, start:, None])[..., 0]
    return token, log_pi.exp().square().sum(-1)


@pytest.mark.parametrize("autocast", [None, torch.bfloat16])
def test_generate_s_forwards_give_the_full_forward_s_statistics(autocast) -> None:
    model = AutoModelForCausalLM.from_pretrained(default_checkpoint()).eval()
    stats = GenerationStats(model, TAU)
    with torch.autocast("cpu", dtype=autocast or torch.float32, enabled=autocast is not None):
        sequences, start = sampled(model, stats)
        logp, sum_pi2 = full_forward(model, sequences, start)
    caught = stats.taken()
    assert caught is not None and stats.taken() is None  # handed over once
    assert caught[0].dtype == caught[1].dtype == torch.float32
    assert caught[0].shape == caught[1].shape == (4, 6)
    # fp32: the KV-cached forwards and the full one differ by float32 round-off; under bf16
    # autocast both carry bf16 rounding of the logits, each its own.
    atol = 1e-5 if autocast is None else 0.1
    torch.testing.assert_close(caught[0], logp, atol=atol, rtol=0)
    torch.testing.assert_close(caught[1], sum_pi2, atol=atol, rtol=0)
    assert bool((caught[1] <= 1).all())
    assert bool((caught[0].exp().square() <= caught[1] + 1e-6).all())  # p² ≤ Σπ²


def test_a_synced_process_s_steps_past_its_tokens_are_cut_off(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Under `synced_gpus` (FSDP, ZeRO-3) a process whose rows have all ended runs forwards
    until every process's have, appending no token: here two more, as if another process were
    still generating. The statistics cover the tokens generated, as without them."""
    model = AutoModelForCausalLM.from_pretrained(default_checkpoint()).eval()
    stats = GenerationStats(model, TAU)
    peers = iter([True, True])  # another process's rows still running for two more steps

    def synced(this_peer_finished: bool, *_: object, **__: object) -> bool:
        return next(peers, False) if this_peer_finished else True

    monkeypatch.setattr(model, "_has_unfinished_sequences", synced)
    prompts = torch.tensor([[14, 18, 10, 12, 8, 19]] * 2)  # "C:684=": 4 tokens, <end> the last
    torch.manual_seed(0)
    sequences = model.generate(input_ids=prompts, attention_mask=torch.ones_like(prompts),
                               do_sample=True, temperature=TAU, top_k=0, max_new_tokens=8,
                               pad_token_id=0, synced_gpus=True)  # fmt: skip
    logp, sum_pi2 = full_forward(model, sequences, prompts.shape[1])
    caught = stats.taken()
    assert caught is not None and sequences.shape[1] - prompts.shape[1] < 8  # ended early
    assert caught[0].shape == caught[1].shape == logp.shape
    torch.testing.assert_close(caught[0], logp, atol=1e-5, rtol=0)
    torch.testing.assert_close(caught[1], sum_pi2, atol=1e-5, rtol=0)


def test_beam_search_is_not_caught() -> None:
    """Beam search reorders its rows at every step: no statistics rather than wrong ones."""
    model = AutoModelForCausalLM.from_pretrained(default_checkpoint()).eval()
    stats = GenerationStats(model, TAU)
    prompts = torch.tensor([[5, 6, 7, 8]])
    model.generate(input_ids=prompts, attention_mask=torch.ones_like(prompts), num_beams=2,
                   do_sample=False, max_new_tokens=3, pad_token_id=0)  # fmt: skip
    assert stats.taken() is None


def test_a_forward_outside_generate_is_not_caught() -> None:
    model = AutoModelForCausalLM.from_pretrained(default_checkpoint()).eval()
    stats = GenerationStats(model, TAU)
    with torch.no_grad():
        model(input_ids=torch.tensor([[5, 6, 7]]))
    assert stats.taken() is None


def test_without_caught_stats_otb_training_takes_one_forward(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The fallback (vLLM, paged or multi-turn generation) trains with the advantages of one
    extra no-grad forward: the same as generate's to float32 round-off on this toy."""
    from trl_toy import toy_trainer

    from otb_diag.integrations.trl import attach
    from otb_diag.integrations.trl.advantages import EXTRA_FORWARD

    runs = {}
    for name, fallback in (("caught", False), ("forward", True)):
        if fallback:
            monkeypatch.setattr(GenerationStats, "taken", lambda self: None)
        trainer = toy_trainer(tmp_path / name, 2, temperature=2.0)
        attach(trainer, split_every=None, advantages="otb", metrics="all")
        trainer.train()
        runs[name] = [e for e in trainer.state.log_history if EXTRA_FORWARD in e]
    assert [e[EXTRA_FORWARD] for e in runs["caught"]] == [0.0, 0.0]
    assert [e[EXTRA_FORWARD] for e in runs["forward"]] == [1.0, 1.0]
    # Step 1 measures the same weights both ways: the two forwards agree to float32 round-off.
    # Step 2's weights went through Adam's first update, lr · m̂/(√v̂ + ε) ≈ ±lr for every
    # component, which turns a round-off difference in a near-zero gradient component into a
    # step of 2·lr: 1.2e-4 apart in the energy here (transformers 5.24, torch 2.13).
    energy = "otb/energy/sequence_mean"
    first, second = (e[energy] for e in runs["caught"]), (e[energy] for e in runs["forward"])
    for (a, b), rel in zip(zip(first, second, strict=True), (1e-6, 1e-3), strict=True):
        assert a == pytest.approx(b, rel=rel)


@pytest.mark.external  # runs TRL's trainer
def test_under_sharding_every_process_stops_where_one_caught_no_stats(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Under ZeRO-3 or FSDP the fallback's forward would be a collective that one process ran
    alone: the processes agree first whether each caught its stats, so a process whose own
    stats fit stops too, with the reason, where another's `generate` gave none, and no process
    runs the forward (on one process here: the other's flag played by `Dist.all_gather`)."""
    from trl_toy import toy_trainer

    from otb_diag.integrations.trl import advantages as swap_module
    from otb_diag.integrations.trl import attach
    from otb_diag.integrations.trl.support import ZERO3
    from otb_diag.runtime.torchrun import Dist

    trainer = toy_trainer(tmp_path, 1, per_step=4)
    live = attach(trainer, split_every=None, advantages="otb")
    live.sharded = ZERO3  # as `support.py:sharding` names a ZeRO-3 trainer
    own, taken = [], GenerationStats.taken
    monkeypatch.setattr(GenerationStats, "taken", lambda self: own.append(taken(self)) or own[-1])
    monkeypatch.setattr(Dist, "all_gather", lambda self, fits: [fits, False])  # process 1's

    def forward(*_: object) -> None:
        raise AssertionError("a no-grad forward of one process's rows under sharding")

    monkeypatch.setattr(swap_module, "no_grad_stats", forward)
    with pytest.raises(swap_module.AdvantageSwapError) as stopped:
        trainer.train()
    assert own[0] is not None and own[0][0].shape[0] == 4  # this process's stats fit
    said = str(stopped.value)
    assert "under DeepSpeed ZeRO-3 otb-diag reads the energy" in said
    assert "process(es) 1 did not generate their 4 rows in one generate call" in said
    assert "every process stops here. Attach without advantages=" in said
    assert "Configuration: TRL" in said and "otb-diag's fault" not in said
