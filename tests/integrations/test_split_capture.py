"""The split's head-mode scores from a loss forward's caught hidden states
(`integrations/trl/split_capture.py`) equal `token_scores`' from its own extra forward, to float32
round-off: on a plain GPT-2 (absolute positions), one with a biased head, and Gemma-2 with its
logit soft-cap; the hook catches nothing outside `catching()` or without grad. Sharded, the
output layer is checked against the loss forward's own log p instead of a probe forward. The
same scores inside a real TRL step: tests/integrations/test_trl_live.py (`test_the_split_...`);
under DeepSpeed ZeRO-3 and FSDP2, with the layer gathered for the scoring:
tests/integrations/test_trl_sharded.py and test_live_sharded.py."""

from __future__ import annotations

import pytest
import torch
from tiny import soft_capped_gemma2
from torch import nn
from transformers import GPT2Config, GPT2LMHeadModel

from otb_diag.errors import InputError
from otb_diag.integrations.core.step_metrics import split_scores
from otb_diag.integrations.trl.split_capture import HiddenCatch
from otb_diag.maths.response_batch import ResponseBatch

V, K = 17, 16
PROMPTS = [[1, 2, 3], [4, 5, 6], [7, 8, 9]]  # one length: TRL pads no prompt, as in trl_toy.py
RESPONSES = [[7, 8, 9, 10], [11, 12], [0, 3, 5, 7, 9, 11]]  # right-padded to C = 6


def gpt2(bias: bool) -> nn.Module:
    torch.manual_seed(0)
    config = GPT2Config(vocab_size=V, n_embd=8, n_layer=2, n_head=2, n_positions=16)
    model = GPT2LMHeadModel(config)
    if bias:  # a biased head: the folded-in bias column
        model.lm_head = nn.Linear(config.n_embd, V, bias=True)
    return model.eval()


def gemma2() -> nn.Module:
    return soft_capped_gemma2(V)


def batch(temperature: float) -> ResponseBatch:
    n = len(RESPONSES)
    length = torch.tensor([len(r) for r in RESPONSES])
    width = int(length.max())
    valid = torch.arange(width)[None] < length[:, None]
    ids = torch.tensor([r + [0] * (width - len(r)) for r in RESPONSES])
    zeros = torch.zeros(n, width)
    return ResponseBatch(
        group_names=["g"], group=torch.zeros(n, dtype=torch.long), sample=torch.arange(n),
        length=length, prompt_ids=PROMPTS, response_ids=ids, valid=valid, mask=valid.float(),
        token_rewards=zeros, reward=torch.zeros(n), temperature=torch.full((n,), temperature),
        step=[None] * n, is_weights=None, logprobs=None, sum_pi2=None,
    )  # fmt: skip


def loss_forward(catch: HiddenCatch, b: ResponseBatch, chunk: int) -> list[torch.Tensor]:
    """A training-style forward (grad on) of `prompt ⧺ completion`, in chunks of `chunk` rows
    as TRL's `_get_per_token_logps_and_entropies` runs it; the caught hidden states."""
    ids = torch.cat([torch.tensor(PROMPTS), b.response_ids], dim=1)
    mask = torch.cat([torch.ones(len(PROMPTS), 3, dtype=torch.long), b.valid.long()], dim=1)
    with catch.catching(True) as caught:
        for lo in range(0, len(ids), chunk):
            catch.model(input_ids=ids[lo : lo + chunk], attention_mask=mask[lo : lo + chunk])
    return caught


@pytest.mark.parametrize("make", [lambda: gpt2(False), lambda: gpt2(True), gemma2])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_loss_forward_scores_equal_the_extra_forwards(make, temperature: float) -> None:
    model, b = make(), batch(temperature)
    catch = HiddenCatch(model)
    reference = split_scores(model, b, K)  # one extra no-grad forward: token_scores, head
    scale = reference.abs().max()
    assert reference.shape == (3, 6, K) and scale > 0
    for _ in range(2):  # the second call skips the output layer's check: the same scores
        caught = loss_forward(catch, b, chunk=2)
        assert [h.shape[0] for h in caught] == [2, 1]
        assert not any(h.requires_grad for h in caught)
        ours = catch.scores(caught, b.response_ids, temperature, K)
        ours = ours * b.valid[..., None]  # as `_finish` zeroes past each response
        torch.testing.assert_close(ours, reference, rtol=1e-5, atol=1e-6 * float(scale))


def test_the_hook_catches_only_grad_enabled_forwards_inside_catching() -> None:
    model = gpt2(False)
    catch = HiddenCatch(model)
    ids = torch.tensor(PROMPTS)
    model(input_ids=ids)  # outside: nothing kept
    with catch.catching(False) as off:
        model(input_ids=ids)
    with catch.catching(True) as on, torch.no_grad():
        model(input_ids=ids)  # generation and the reference model run without grad
    assert off == [] and on == []
    with catch.catching(True) as on:
        out = model(input_ids=ids, output_hidden_states=True)
    assert len(on) == 1
    torch.testing.assert_close(on[0], out.hidden_states[-1], rtol=0, atol=0)


def loss_logprobs(model: nn.Module, b: ResponseBatch, temperature: float) -> torch.Tensor:
    """`[m, C]` the completion tokens' log p at `temperature` from the model's own logits, as
    TRL's fused head returns them with the loss."""
    ids = torch.cat([torch.tensor(PROMPTS), b.response_ids], dim=1)
    c = b.response_ids.shape[1]
    logits = model(input_ids=ids).logits[:, -c - 1 : -1] / temperature  # [m, C, V]
    return logits.log_softmax(-1).gather(-1, b.response_ids[..., None])[..., 0].detach()


@pytest.mark.parametrize("make", [lambda: gpt2(True), gemma2])
def test_a_sharded_catch_checks_its_layer_against_the_loss_forwards_log_p(make) -> None:
    """The scores are the unsharded catch's (no sharding here: the gather does nothing); the
    layer is checked against the log p of the forward that trained, not a probe forward; a log
    p its layer does not give, or none, is refused; the check runs on the first call only."""
    model, b, temperature = make(), batch(0.7), 0.7
    plain = HiddenCatch(model)  # checked by the probe forward
    reference = plain.scores(loss_forward(plain, b, 3), b.response_ids, temperature, K)
    logprobs = loss_logprobs(model, b, temperature)
    with pytest.raises(InputError, match="differ from the loss's own by"):
        HiddenCatch(model, sharded=True).scores(
            loss_forward(HiddenCatch(model), b, 3), b.response_ids, temperature, K,
            logprobs + 0.01 * b.valid, b.valid,
        )  # fmt: skip
    with pytest.raises(InputError, match="this forward gave none"):
        HiddenCatch(model, sharded=True).scores(
            loss_forward(HiddenCatch(model), b, 3), b.response_ids, temperature, K
        )
    sharded = HiddenCatch(model, sharded=True)
    caught = loss_forward(sharded, b, chunk=2)
    ours = sharded.scores(caught, b.response_ids, temperature, K, logprobs, b.valid)
    torch.testing.assert_close(ours, reference, rtol=1e-5, atol=1e-6 * float(reference.abs().max()))
    again = sharded.scores(caught, b.response_ids, temperature, K)  # checked once: none needed
    torch.testing.assert_close(again, ours, rtol=0, atol=0)
