"""The two `full`-mode engines: forward mode (jvp) and reverse mode (vjp) give the same
projections on the same seeded directions, across architectures, blocks, parameter selections
and bf16; the directions regenerate; the cost model refuses and accepts as documented."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from numerics import assert_close_to_norm
from test_token_scores import RESPONSES, V, make_batch, one_token_grads, tiny_gemma2
from torch import nn
from transformers import (
    FalconConfig,
    FalconForCausalLM,
    GPT2Config,
    GPT2LMHeadModel,
    GPTNeoXConfig,
    GPTNeoXForCausalLM,
    LlamaConfig,
    LlamaForCausalLM,
    MistralConfig,
    MistralForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
)

from otb_diag.errors import InputError
from otb_diag.maths.returns import returns_to_go
from otb_diag.maths.variance.blocks import (
    block_tables,
    projection_error,
    subsketch_coordinates,
)
from otb_diag.maths.variance.paired_draws import paired_estimates, variance_table
from otb_diag.policy.scores import cost as full_cost
from otb_diag.policy.scores import forward_mode as scores_forward_module
from otb_diag.policy.scores import token_scores as scores_module
from otb_diag.policy.scores.chunked_attention import NAME
from otb_diag.policy.scores.directions import (
    Block,
    block_of,
    parameter_blocks,
    projection_columns,
    select_parameters,
    unit_pieces,
)
from otb_diag.policy.scores.token_scores import token_scores

SMALL = {"vocab_size": V, "hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 2,
         "num_attention_heads": 2}  # fmt: skip


def gpt2(layers: int = 2) -> nn.Module:
    torch.manual_seed(0)
    config = GPT2Config(vocab_size=V, n_embd=16, n_layer=layers, n_head=2, n_positions=16,
                        tie_word_embeddings=False)  # fmt: skip
    return GPT2LMHeadModel(config).eval()


def llama() -> nn.Module:
    torch.manual_seed(1)
    return LlamaForCausalLM(LlamaConfig(**SMALL, num_key_value_heads=1)).eval()


def qwen2() -> nn.Module:
    torch.manual_seed(2)
    return Qwen2ForCausalLM(Qwen2Config(**SMALL, num_key_value_heads=1)).eval()


def mistral() -> nn.Module:
    torch.manual_seed(3)
    return MistralForCausalLM(MistralConfig(**SMALL, num_key_value_heads=1)).eval()


def falcon() -> nn.Module:
    """Its attention does not go through transformers' `AttentionInterface` (eager, not chunked)."""
    torch.manual_seed(7)
    return FalconForCausalLM(FalconConfig(vocab_size=V, hidden_size=16, num_hidden_layers=2,
                                          num_attention_heads=2)).eval()  # fmt: skip


def gpt_neox() -> nn.Module:
    torch.manual_seed(4)
    return GPTNeoXForCausalLM(GPTNeoXConfig(**SMALL, max_position_embeddings=32)).eval()


def both(model: nn.Module, batch, k: int = 8, **kwargs):
    """(vjp, jvp) scores of the same directions."""
    vjp = token_scores(model, batch, "full", k, seed=3, engine="vjp", chunk_size=4, **kwargs)
    jvp = token_scores(model, batch, "full", k, seed=3, engine="jvp", **kwargs)
    return vjp, jvp


# OPT is left out: on its tied input embedding the engines differ by ~1 % of the projection
# (forward mode agrees with float64 finite differences, reverse mode with autograd); an open
# question reported with issue 10, not hidden by a tolerance.
@pytest.mark.parametrize("build", [gpt2, llama, qwen2, mistral, gpt_neox, tiny_gemma2, falcon])
def test_engines_agree_across_architectures(build) -> None:
    model, batch = build(), make_batch([0.7, 1.3, 1.0])
    vjp, jvp = both(model, batch)
    assert (vjp.engine, jvp.engine, vjp.sq_norm_exact, jvp.sq_norm_exact) == (
        "vjp", "jvp", True, False
    )  # fmt: skip
    assert_close_to_norm(jvp.proj, vjp.proj, rel=1e-5, msg=build.__name__)
    assert (jvp.proj[~batch.valid] == 0).all()
    # the model is left as it was: its attention implementation restored, no gradients kept
    assert model.config._attn_implementation not in ("eager", NAME) or build is tiny_gemma2
    assert all(p.grad is None for p in model.parameters())


@pytest.mark.parametrize("by_block", [False, True])
def test_reverse_engine_is_the_explicit_projection_of_autograd_gradients(by_block: bool) -> None:
    """vjp's u_t = P s_t with P's rows rebuilt from `projection_columns`, and exact norms."""
    model, batch = gpt2(), make_batch([1.0, 0.8, 1.2])
    params = select_parameters(model, None)
    blocks = parameter_blocks(model, list(params), by_block=by_block, k=8)
    out = token_scores(model, batch, "full", 8, seed=3, engine="vjp", by_block=by_block)
    cols = torch.cat([  # [n_params, K], block-diagonal
        torch.cat([projection_columns(3, range(b.k), n, p.numel(), b.k, "cpu")
                   if n in b.params else torch.zeros(p.numel(), b.k) for b in blocks], dim=1)
        for n, p in params.items()
    ])  # fmt: skip
    for (i, t), g in one_token_grads(model, batch, list(model.parameters())).items():
        assert_close_to_norm(out.proj[i, t], g @ cols, rel=1e-5)
        torch.testing.assert_close(out.sq_norm[i, t], g.square().sum(), rtol=1e-4, atol=0)
    assert out.blocks == tuple((b.name, b.offset, b.k) for b in blocks)
    torch.testing.assert_close(out.block_sq_norm.sum(-1), out.sq_norm)


def test_engines_agree_on_the_embedded_default() -> None:
    from otb_diag.io.loading import LoadOptions, checkpoint_batch, load_rollouts
    from otb_diag.io.scenarios import DEFAULT_ROLLOUTS, default_checkpoint
    from otb_diag.policy.scores.cost import _sub_batch

    ckpt, batch, _ = checkpoint_batch(
        default_checkpoint(), load_rollouts(DEFAULT_ROLLOUTS), LoadOptions()
    )
    sub = _sub_batch(batch, [0, 1, 40, 100, 200, 300], 20)
    vjp, jvp = both(ckpt.model, sub, k=6, by_block=True, directions_per_block=1)
    assert [name for name, _, _ in vjp.blocks] == [
        "embeddings", "layer.0", "layer.1", "layer.2", "final_norm", "head"
    ]  # fmt: skip
    assert_close_to_norm(jvp.proj, vjp.proj, rel=1e-5)


def direction_piece(seed: int, j: int, name: str, shape: tuple[int, ...], k: int) -> torch.Tensor:
    """The piece of direction `v_j` on parameter `name` (CPU): entries `N(0, 1/k)`."""
    return unit_pieces(seed, [j], name, shape, "cpu")[0] / math.sqrt(k)


def test_directions_regenerate_identically_and_independently() -> None:
    a = direction_piece(7, 3, "model.layers.0.mlp.up_proj.weight", (5, 4), 16)
    again = direction_piece(7, 3, "model.layers.0.mlp.up_proj.weight", (5, 4), 16)
    assert torch.equal(a, again)
    name = "model.layers.0.mlp.up_proj.weight"
    for other in [(8, 3, name), (7, 4, name), (7, 3, name.replace("0", "1"))]:
        assert not torch.allclose(a, direction_piece(*other, (5, 4), 16))
    # the scale is 1/√k: over many entries, the variance is 1/k
    big = direction_piece(0, 0, "w", (200_000,), 16)
    assert big.var().item() == pytest.approx(1 / 16, rel=0.02)
    # the reverse engine's columns are the same pieces
    cols = projection_columns(7, range(2, 5), "x", 20, 16, "cpu")
    torch.testing.assert_close(cols[:, 1], direction_piece(7, 3, "x", (20,), 16))


def test_forward_engine_does_not_depend_on_batching() -> None:
    model, batch = gpt2(), make_batch()
    a = token_scores(model, batch, "full", 8, seed=1, engine="jvp")
    b = token_scores(model, batch, "full", 8, seed=1, engine="jvp", batch_tokens=8)
    assert_close_to_norm(b.proj, a.proj, rel=1e-5)
    c = token_scores(model, batch, "full", 8, seed=2, engine="jvp")
    assert not torch.allclose(a.proj[batch.valid], c.proj[batch.valid])


def test_blocks_of_common_architectures() -> None:
    head = frozenset({"lm_head.weight", "embed_out.weight"})
    cases = {
        "transformer.wte.weight": "embeddings", "transformer.wpe.weight": "embeddings",
        "transformer.h.11.attn.c_attn.weight": "layer.11", "transformer.ln_f.bias": "final_norm",
        "model.embed_tokens.weight": "embeddings",
        "model.layers.3.self_attn.q_proj.weight": "layer.3",
        "model.norm.weight": "final_norm", "lm_head.weight": "head", "embed_out.weight": "head",
        "gpt_neox.layers.0.mlp.dense_h_to_4h.bias": "layer.0",
        "gpt_neox.final_layer_norm.weight": "final_norm",
        "model.decoder.layers.1.fc1.weight": "layer.1",
        "model.decoder.embed_positions.weight": "embeddings",
        "model.layers.2.self_attn.q_proj.lora_A.default.weight": "layer.2",
    }  # fmt: skip
    assert {name: block_of(name, head) for name in cases} == cases
    model = gpt_neox()
    blocks = parameter_blocks(model, [n for n, _ in model.named_parameters()], by_block=True, k=10)
    assert [b.name for b in blocks] == ["embeddings", "layer.0", "layer.1", "final_norm", "head"]
    assert [b.k for b in blocks] == [2] * 5 and [b.offset for b in blocks] == [0, 2, 4, 6, 8]


def test_params_regex_selects_the_head_exactly() -> None:
    """Full mode on the head alone gives the head's exact norms, `w · ‖h‖²` (head mode)."""
    model, batch = gpt2(), make_batch([0.8, 1.2, 1.0])
    out = token_scores(model, batch, "full", 8, seed=0, engine="vjp", params=r"^lm_head\.")
    head = token_scores(model, batch, "head", 16, seed=0)
    torch.testing.assert_close(out.sq_norm, head.sq_norm, rtol=1e-4, atol=1e-7)
    with pytest.raises(InputError, match="matches none"):
        token_scores(model, batch, "full", 8, seed=0, params="no_such_parameter")
    with pytest.raises(InputError, match="regular expression"):
        token_scores(model, batch, "full", 8, seed=0, params="(")


def test_bf16_forward_mode_tracks_fp32() -> None:
    """bf16 weights, bf16 tangents, fp32 log-softmax: within bf16 rounding of the fp32 run on
    the same (bf16-rounded) weights; reverse mode runs on bf16 too."""
    model16 = gpt2().to(torch.bfloat16)
    model32 = gpt2().to(torch.bfloat16).float()
    batch = make_batch()
    a = token_scores(model16, batch, "full", 8, seed=0, engine="jvp")
    b = token_scores(model32, batch, "full", 8, seed=0, engine="jvp")
    assert a.proj.dtype == torch.float32
    assert_close_to_norm(a.proj, b.proj, rel=5e-2)
    r = token_scores(model16, batch, "full", 8, seed=0, engine="vjp")
    assert_close_to_norm(r.proj, b.proj, rel=5e-2)


def test_jvp_norms_are_the_unbiased_jl_estimate() -> None:
    model, batch = gpt2(), make_batch()
    vjp, jvp = both(model, batch, k=8)
    torch.testing.assert_close(jvp.sq_norm, jvp.proj.square().sum(-1))
    # averaged over many seeds, ‖u_t‖² comes to the exact ‖s_t‖² (relative std √(2/k) each)
    runs = torch.stack(
        [token_scores(model, batch, "full", 8, seed=s, engine="jvp").sq_norm for s in range(60)]
    )
    ratio = runs.mean(0)[batch.valid] / vjp.sq_norm[batch.valid]
    assert ratio.mean().item() == pytest.approx(1.0, abs=4 * math.sqrt(2 / 8 / 60))


# ---------------------------------------------------------------------------------------------
# Per-block variance and the projection error
# ---------------------------------------------------------------------------------------------


def paired_of(scores, batch):
    returns = returns_to_go(batch.token_rewards, batch.mask)
    return paired_estimates(
        returns, batch.mask, batch.group, scores.proj, {"proxy": scores.sq_norm},
        aggregations=("token-sum",), group_sizes=(2,), draws=30, bootstrap=50, seed=0,
        mode="full",
    )  # fmt: skip


def pooled_batch():
    """Two prompts with pools of 4 responses (rewards mixed), from the tiny prompts/responses."""
    from otb_diag.maths.response_batch import ResponseBatch, pad

    prompts = [[1, 2], [3]] * 4
    responses = [[4, 5, 6], [7, 8], [9, 10, 11, 12], [5], [6, 7], [8, 9, 10], [11], [12, 4]]
    n, length = len(responses), torch.tensor([len(r) for r in responses])
    width = int(length.max())
    valid = torch.arange(width)[None] < length[:, None]
    reward = torch.tensor([1.0, 0, 0, 1, 1, 0, 1, 0])
    rewards = torch.zeros(n, width)
    rewards[torch.arange(n), length - 1] = reward
    return ResponseBatch(
        group_names=["a", "b"], group=torch.tensor([0, 1] * 4), sample=torch.arange(n),
        length=length, prompt_ids=prompts, response_ids=pad(responses, width, 0, torch.long),
        valid=valid, mask=valid.float(), token_rewards=rewards, reward=reward,
        temperature=torch.ones(n), step=[None] * n, is_weights=None, logprobs=None, sum_pi2=None,
    )  # fmt: skip


def test_block_variances_sum_to_the_total() -> None:
    """tr Cov(ĝ) = Σ_b tr Cov(ĝ_b) (theory.md §4), on the same draws."""
    model, batch = gpt2(), pooled_batch()
    scores = token_scores(model, batch, "full", 12, seed=0, engine="vjp", by_block=True)
    paired = paired_of(scores, batch)
    total = variance_table(paired).set_index(["baseline", "group_size"])["variance"]
    blocks = block_tables(paired, scores.blocks)
    assert list(blocks["block"].unique()) == [
        "embeddings",
        "layer.0",
        "layer.1",
        "final_norm",
        "head",
    ]
    summed = blocks.groupby(["baseline", "group_size"])["variance"].sum()
    np.testing.assert_allclose(summed.loc[total.index], total, rtol=1e-10)
    assert (blocks.loc[blocks["baseline"] == "mean", "ratio_to_mean"] == 1).all()


def test_projection_error_from_subsketches() -> None:
    blocks = [("a", 0, 8), ("b", 8, 8)]
    subsets = subsketch_coordinates(blocks, 4)
    assert sorted(np.concatenate(subsets).tolist()) == list(range(16))
    assert [s.tolist() for s in subsets][:2] == [[0, 4, 8, 12], [1, 5, 9, 13]]
    model, batch = gpt2(), pooled_batch()
    scores = token_scores(model, batch, "full", 64, seed=0, engine="vjp")
    err = projection_error(paired_of(scores, batch), scores.blocks)
    assert err["k"] == 64 and err["subsketches"] == 8
    assert err["theory_worst_case"] == pytest.approx(math.sqrt(2 / 64))
    # a projection error, bounded by its rank-one worst case (with room for the estimate's own
    # noise from 8 sub-sketches) and not zero
    assert 0 < err["variance_relative_error"] < 2 * err["theory_worst_case"]
    assert projection_error(paired_of(scores, batch), [("all", 0, 3)]) == {}


# ---------------------------------------------------------------------------------------------
# The cost model
# ---------------------------------------------------------------------------------------------


def plan(model, batch, **kwargs):
    params = select_parameters(model, None)
    blocks = [Block("all", tuple(params), 8, 0)]
    return full_cost.plan_full(model, batch, params, blocks, 0, **kwargs)


def test_cost_model_refuses_over_budget_unless_forced() -> None:
    model, batch = gpt2(), make_batch()
    with pytest.raises(InputError, match="exceeds the budget") as info:
        plan(model, batch, engine="jvp", budget_s=1e-9)
    assert "--force" in info.value.hint
    forced = plan(model, batch, engine="jvp", budget_s=1e-9, force=True)
    assert forced.engine == "jvp" and 0 < forced.forward_s < math.inf
    ok = plan(model, batch, budget_s=3600)
    assert ok.engine in ("jvp", "vjp") and ok.estimate_s <= 3600
    assert "estimated forward mode (jvp)" in ok.describe()
    tokens = sum(len(r) for r in RESPONSES)
    assert ok.tokens == tokens and ok.directions == 8 and ok.n_params > 0


def test_forward_mode_packs_small_batches_on_the_cpu_and_runs_as_planned() -> None:
    model, batch = gpt2(), make_batch()
    cap = full_cost.CPU_FORWARD_BATCH_TOKENS
    assert plan(model, batch, engine="jvp", batch_tokens=16384).forward_batch_tokens == cap
    assert plan(model, batch, engine="jvp", batch_tokens=12).forward_batch_tokens == 12
    seen: list[int] = []
    real = scores_forward_module.forward_scores

    def spy(*args, **kwargs):
        seen.append(kwargs["batch_tokens"])
        return real(*args, **kwargs)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(scores_module, "forward_scores", spy)
        token_scores(model, batch, "full", 8, seed=0, engine="jvp", batch_tokens=16384)
    assert seen == [cap]


def test_cost_model_refuses_what_does_not_fit_in_memory() -> None:
    model, batch = gpt2(), make_batch()
    with pytest.raises(InputError, match="does not fit in memory"):
        plan(model, batch, engine="vjp", available_bytes=1e5)
    # forward mode needs far less than reverse mode: with a little memory it still runs
    small = plan(model, batch, available_bytes=4e6)
    assert small.engine == "jvp" and small.reverse_s == math.inf


@pytest.mark.parametrize(
    ("forward", "reverse", "engine"), [(1.0, 3.0, "jvp"), (1.0, 1.5, "vjp"), (math.inf, 5, "vjp")]
)
def test_auto_prefers_exact_norms_unless_forward_is_much_faster(forward, reverse, engine) -> None:
    assert full_cost.choose_engine(forward, reverse) == engine


def test_chosen_engine_follows_the_cost_model(monkeypatch: pytest.MonkeyPatch) -> None:
    model, batch = gpt2(), make_batch()
    monkeypatch.setattr(full_cost, "choose_engine", lambda f, r: "jvp")
    assert token_scores(model, batch, "full", 8, seed=0).engine == "jvp"


def test_auto_choice_counts_work_and_ignores_the_clock(monkeypatch: pytest.MonkeyPatch) -> None:
    """`auto` must not flip with the machine's load (nor between torchrun ranks): the same
    engine whatever the calibration timings say; the counts are the documented flops."""
    model, batch = gpt2(), make_batch()
    chosen = {plan(model, batch, budget_s=None).engine}
    for tick in (1e-9, 1e3):  # every timed interval looks tiny, then huge
        clock = iter(range(10**6))
        monkeypatch.setattr(full_cost.time, "perf_counter", lambda c=clock, t=tick: next(c) * t)
        chosen.add(plan(model, batch, budget_s=None).engine)
    assert len(chosen) == 1
    # Hand count: N = 10 parameters, n = 4 selected, K = 2, rows (P, T) = (1, 3), chunk 2.
    tiny = nn.Linear(2, 5, bias=False)  # 10 parameters
    forward, reverse = full_cost.work_counts(tiny, 4, 2, 8, [(1, 3)], 2)
    assert forward == 3.0 * 2 * 10 * 2 * 8
    # Σ_t L_t = 2 tokens · (1 + 2) + 1 token · (1 + 3) = 10
    assert reverse == 3.0 * 2 * 10 * 10 + 2 * 4 * 2 * 3
    assert full_cost.choose_engine(forward, reverse) == "vjp"  # 2 · 960 > 648


def test_forward_peak_counts_one_query_chunk_of_attention_scores(monkeypatch) -> None:
    """With the query-chunked attention the estimate holds `max(SCORES_PER_CHUNK, rows · h · L)`
    scores, not the eager `rows · h · L²` (full_cost docstring); models that cannot switch keep
    the eager count."""
    model, batch = gpt2(), make_batch()  # 3 rows, longest prompt ⧺ response L = 8, h = 2
    monkeypatch.setattr(full_cost, "SCORES_PER_CHUNK", 1)
    kwargs = {"engine": "jvp", "budget_s": None, "available_bytes": 1e12}
    chunked = plan(model, batch, **kwargs)
    monkeypatch.setattr(full_cost, "switchable", lambda m: False)
    eager = plan(model, batch, **kwargs)
    nd = chunked.directions_batch
    assert eager.directions_batch == nd
    eager_scores, chunk_scores = 3 * 2 * 8 * 8, 3 * 2 * 8
    expected = (1 + nd) * 4 * 2 * (eager_scores - chunk_scores)
    assert eager.forward_peak_bytes - chunked.forward_peak_bytes == expected
