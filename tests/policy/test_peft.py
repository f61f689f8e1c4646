"""Every public entry of policy/ takes a PEFT-wrapped model (`otb_diag/policy/causal_lm.py`):
a LoRA policy (B ≠ 0, so the adapter moves every logit) gives the numbers of its merged weights
(`merge_and_unload`), on a GPT-2 body (Conv1D layers, `fan_in_fan_out`) and a Qwen2 one
(`nn.Linear`). Full mode scores the parameters that train, the adapter's: their per-token
gradients are the merged model's through the chain rule, `∂/∂B = s·G·Aᵀ`, `∂/∂A = s·Bᵀ·G`
(G the merged weight's gradient as `[out, in]`), projected on the directions of their names; the
frozen weights, selected by name, have the merged model's gradient norms. Issue 52's crash (the
output layer's check read the tuner's logits as the backbone's hidden state) is the first test.
An adapter the passes cannot run (prompt learning, one on the output layer) is refused."""

from __future__ import annotations

import copy
import itertools
from collections.abc import Callable

import pytest
import torch
from test_forward_pass import tiny_gpt2, tiny_qwen2
from test_placement import PROMPTS, RESPONSES, make_batch

from otb_diag.errors import InputError
from otb_diag.policy.causal_lm import causal_lm
from otb_diag.policy.forward_pass import (
    check_output_layer,
    checkpoint_stats,
    final_hidden,
    head_logits,
    head_weight,
    output_layer,
    pad_batch,
    response_token_stats,
    stats_for_sequences,
)
from otb_diag.policy.noise import RowNoise
from otb_diag.policy.sampling import Sampling, sample_batch
from otb_diag.policy.scores.directions import (
    parameter_blocks,
    projection_columns,
    select_parameters,
)
from otb_diag.policy.scores.forward_mode import forward_scores
from otb_diag.policy.scores.reverse_mode import reverse_scores
from otb_diag.policy.scores.token_scores import (
    head_sketch_from_hidden,
    head_sketch_of,
    token_scores,
)
from otb_diag.policy.surrogate_loss import surrogate_loss

peft = pytest.importorskip("peft")

# The adapted modules of each body: attention and MLP input projections.
TARGETS = {"gpt2": ["c_attn", "c_fc"], "qwen2": ["q_proj", "v_proj", "up_proj"]}
BODIES = {"gpt2": tiny_gpt2, "qwen2": tiny_qwen2}
TAU = [0.7, 1.0, 1.3]
K, SEED = 6, 3


def lora(arch: str) -> tuple[torch.nn.Module, torch.nn.Module]:
    """A LoRA policy (r = 4, α = 8, B and A random: `init_lora_weights=False`) on the tiny `arch`
    body, and its merged weights as a plain model."""
    torch.manual_seed(1)
    config = peft.LoraConfig(
        r=4, lora_alpha=8, target_modules=TARGETS[arch], init_lora_weights=False,
        fan_in_fan_out=arch == "gpt2",  # GPT-2's Conv1D stores its weight as [in, out]
    )  # fmt: skip
    wrapped = peft.get_peft_model(BODIES[arch](), config).eval()
    merged = copy.deepcopy(wrapped).merge_and_unload().eval()
    return wrapped, merged.requires_grad_(True)  # PEFT froze the weights it wraps


def close(a: torch.Tensor, b: torch.Tensor) -> None:
    """Merged and unmerged weights differ in the order of their float32 sums only."""
    scale = float(b.detach().abs().max()) if b.numel() else 1.0
    torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5 * max(1.0, scale))


@pytest.fixture(params=list(BODIES), scope="module")
def pair(request: pytest.FixtureRequest) -> tuple[str, torch.nn.Module, torch.nn.Module]:
    return (request.param, *lora(request.param))


def test_the_output_layers_check_reads_the_backbone_through_the_wrapper(pair) -> None:
    """Issue 52: the probe hooked the wrapper's `base_model`, the tuner, whose forward returns
    logits (read as the hidden state: `mat1 and mat2 shapes cannot be multiplied` in TRL; here,
    with peft 0.21, "its forward does not run its backbone"). Now it passes, the head is the
    merged model's and the backbone's hidden states are the merged backbone's."""
    _, wrapped, merged = pair
    assert causal_lm(wrapped) is wrapped.get_base_model() and causal_lm(merged) is merged
    check_output_layer(wrapped)
    weight, bias, scale, softcap = output_layer(wrapped)
    assert torch.equal(weight, output_layer(merged)[0]) and (bias, scale, softcap) == (
        *output_layer(merged)[1:],
    )
    ids, mask, _ = pad_batch(PROMPTS, RESPONSES)
    hidden = final_hidden(wrapped, ids, mask)
    close(hidden, final_hidden(merged, ids, mask))
    logits = head_logits(hidden.flatten(0, 1), head_weight(weight), bias, softcap, scale)
    close(logits, merged(input_ids=ids, attention_mask=mask).logits.flatten(0, 1))


STATS: dict[str, Callable] = {
    "checkpoint_stats": lambda m: vars(checkpoint_stats(m, make_batch(TAU))),
    "response_token_stats": lambda m: vars(
        response_token_stats(m, *pad_batch(PROMPTS, RESPONSES), torch.tensor(TAU))
    ),
    "stats_for_sequences": lambda m: {
        f"{name}.{i}": value
        for i, row in enumerate(stats_for_sequences(m, PROMPTS, RESPONSES, TAU))
        for name, value in vars(row).items()
    },
    "token_scores-head": lambda m: vars(token_scores(m, make_batch(TAU), "head", K, SEED)),
    "head_sketch": lambda m: dict(
        enumerate(
            head_sketch_from_hidden(
                head_sketch_of(m, K, SEED),
                torch.randn(5, causal_lm(m).config.hidden_size, generator=_gen()),
                torch.tensor([1, 4, 9, 2, 0]),
                torch.tensor([1.0, 0.7, 1.0, 1.3, 1.0]),
            )
        )
    ),
    "surrogate_loss": lambda m: {
        "loss": surrogate_loss(
            m, make_batch(TAU), torch.linspace(-1, 1, 18).view(3, 6), "token-mean"
        ).detach()
    },
}


def _gen() -> torch.Generator:
    return torch.Generator().manual_seed(0)


@pytest.mark.parametrize("entry", list(STATS))
def test_each_entry_gives_the_merged_models_numbers(pair, entry) -> None:
    """Statistics, head-mode scores, the head sketch of given hidden states and the surrogate
    loss: the LoRA policy's are its merged weights', field by field."""
    _, wrapped, merged = pair
    got, want = STATS[entry](wrapped), STATS[entry](merged)
    assert got.keys() == want.keys()
    for name, value in want.items():
        if isinstance(value, torch.Tensor):
            close(got[name], value)
        else:
            assert got[name] == value, name


def test_the_sampler_draws_the_merged_models_samples(pair) -> None:
    """Per-row noise: the same tokens, log p and Σπ² from the wrapper as from the merged
    weights."""
    _, wrapped, merged = pair
    vocab = output_layer(merged)[0].shape[0]

    def sample(model: torch.nn.Module) -> list:
        return sample_batch(
            model, PROMPTS, RowNoise([5, 6, 7]), Sampling(1.0, 0, 1.0, 5), eos_ids=[vocab - 1],
            pad_id=0,
        )  # fmt: skip

    got, want = sample(wrapped), sample(merged)
    assert [s.response_ids for s in got] == [s.response_ids for s in want]
    for a, b in itertools.chain.from_iterable(
        zip(x.logprobs + x.sum_pi2, y.logprobs + y.sum_pi2, strict=True)
        for x, y in zip(got, want, strict=True)
    ):
        assert a == pytest.approx(b, rel=1e-5, abs=1e-6)


def merged_token_grads(merged: torch.nn.Module, names: list[str]) -> list[dict[str, torch.Tensor]]:
    """Per response token (row by row, t in order), `∂ log π(y_t)/∂W` of the merged weights
    `names`, by autograd on one unpadded row at a time: the independent computation."""
    params = dict(merged.named_parameters())
    out = []
    for prompt, response, tau in zip(PROMPTS, RESPONSES, TAU, strict=True):
        ids = torch.tensor([prompt + response])
        logits = merged(input_ids=ids).logits[0].float()
        for t, y in enumerate(response):
            logp = torch.log_softmax(logits[len(prompt) + t - 1] / tau, -1)[y]
            grads = torch.autograd.grad(logp, [params[n] for n in names], retain_graph=True)
            out.append(dict(zip(names, grads, strict=True)))
    return out


@pytest.fixture(scope="module")
def chain_rule(pair) -> tuple[list[str], torch.Tensor, torch.Tensor]:
    """The adapter's parameter names, and per response token its projection `[N, K]` and
    `‖s_t‖²` `[N]` from the merged model's gradients by the chain rule (module docstring)."""
    _, wrapped, merged = pair
    adapted = {
        name: module
        for name, module in causal_lm(wrapped).named_modules()
        if isinstance(module, peft.tuners.lora.LoraLayer)
    }
    names = [f"{m}.lora_{ab}.default.weight" for m in adapted for ab in "AB"]
    proj, sq = [], []
    for g in merged_token_grads(merged, [f"{m}.weight" for m in adapted]):
        adapter = {}
        for m, module in adapted.items():
            a, b = module.lora_A["default"].weight, module.lora_B["default"].weight
            s = module.scaling["default"]
            gm = g[f"{m}.weight"]
            gm = gm.T if module.fan_in_fan_out else gm  # [out, in]
            adapter[f"{m}.lora_A.default.weight"] = s * b.T @ gm
            adapter[f"{m}.lora_B.default.weight"] = s * gm @ a.T
        proj.append(
            sum(
                v.flatten() @ projection_columns(SEED, range(K), n, v.numel(), K, "cpu")
                for n, v in adapter.items()
            )
        )
        sq.append(sum(v.square().sum() for v in adapter.values()))
    return names, torch.stack(proj).detach(), torch.stack(sq).detach()


@pytest.mark.parametrize("engine", ["jvp", "vjp"])
def test_full_mode_scores_the_adapter_by_the_chain_rule(pair, chain_rule, engine) -> None:
    """`params=None` selects what trains, the adapter (`lora_A`, `lora_B` of every adapted
    module, nothing else). Each token's projection from either engine is
    `Σ_p ⟨v_p, ∂ log p_t/∂p⟩` over them with the adapter's gradients formed from the merged
    model's: `∂/∂B = s G Aᵀ`, `∂/∂A = s Bᵀ G` (G as `[out, in]`: a Conv1D's transposed), and
    the reverse engine's `‖s_t‖²` is their sum of squares."""
    _, wrapped, _ = pair
    names, want_proj, want_sq = chain_rule
    selected = select_parameters(wrapped, None)
    assert sorted(selected) == sorted(names)
    blocks = parameter_blocks(wrapped, list(selected), by_block=False, k=K)
    batch = make_batch(TAU)
    if engine == "jvp":
        proj = forward_scores(
            wrapped, batch, selected, blocks, SEED, batch_tokens=4096, directions_batch=K
        )
    else:
        proj, block_sq = reverse_scores(wrapped, batch, selected, blocks, SEED, chunk_size=8)
        close(block_sq[batch.valid][:, 0], want_sq)
    close(proj[batch.valid], want_proj)


def test_the_frozen_weights_have_the_merged_models_gradient_norms(pair) -> None:
    """Selected by name (every parameter but the adapter's), the reverse engine's per-token,
    per-block `‖s_{t,b}‖²` are the merged model's over all its parameters: the frozen weight
    of an adapted layer has the merged weight's gradient (`W + s·BA` is linear in W)."""
    _, wrapped, merged = pair
    batch = make_batch(TAU)
    kwargs = dict(engine="vjp", budget_s=None, by_block=True, directions_per_block=2)
    got = token_scores(wrapped, batch, "full", K, SEED, params="^(?!.*lora_)", **kwargs)
    want = token_scores(merged, batch, "full", K, SEED, **kwargs)
    assert [b[0] for b in got.blocks] == [b[0] for b in want.blocks]
    close(got.block_sq_norm, want.block_sq_norm)


def test_adapters_the_passes_cannot_run_are_refused() -> None:
    """Prompt tuning adds virtual tokens in the wrapper's forward; an adapter on the output
    layer changes the logits its weight alone gives: each one clear `InputError`."""
    prompt = peft.get_peft_model(
        tiny_gpt2(), peft.PromptTuningConfig(task_type="CAUSAL_LM", num_virtual_tokens=2)
    )
    with pytest.raises(InputError, match="PROMPT_TUNING.*adds virtual tokens"):
        checkpoint_stats(prompt, make_batch(TAU))
    head = peft.get_peft_model(tiny_gpt2(), peft.LoraConfig(r=2, target_modules=["lm_head"]))
    with pytest.raises(InputError, match="a PEFT adapter adapts the output layer"):
        token_scores(head, make_batch(TAU), "head", K, SEED)
