"""Per-token statistics: the proxy against autograd, numerics, alignment, chunking, packing."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from numerics import assert_close_to_norm
from tiny import char_tokenizer, tiny_model
from transformers import (
    Gemma2Config,
    Gemma2ForCausalLM,
    GPT2Config,
    GPT2LMHeadModel,
    GraniteConfig,
    GraniteForCausalLM,
    LlamaConfig,
    LlamaForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
)

from otb_diag.errors import InputError
from otb_diag.io.checkpoint import load_checkpoint
from otb_diag.io.load_options import LoadOptions
from otb_diag.maths.energy.token_stats import cumulative_energy, sequence_energy, stats_from_logits
from otb_diag.policy.forward_pass import (
    BATCH_TOKENS,
    MAX_BATCH_TOKENS,
    MAX_STATS_CHUNK,
    STATS_CHUNK,
    check_output_layer,
    checkpoint_stats,
    pack_by_tokens,
    pad_batch,
    response_token_stats,
    stats_for_sequences,
    stats_plan,
)

V = 50
TAUS = [1.0, 0.7, 1.5]


def tiny_gpt2(seed: int = 0, tied: bool = False) -> GPT2LMHeadModel:
    torch.manual_seed(seed)
    config = GPT2Config(
        vocab_size=V, n_embd=32, n_layer=2, n_head=2, n_positions=64, tie_word_embeddings=tied
    )
    return GPT2LMHeadModel(config).eval()


LLAMA_LIKE = dict(
    vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
    num_attention_heads=2, num_key_value_heads=2, tie_word_embeddings=False,
)  # fmt: skip


def tiny_granite(seed: int = 0) -> GraniteForCausalLM:
    """Untied, with Granite's final `logits / logits_scaling`."""
    torch.manual_seed(seed)
    return GraniteForCausalLM(GraniteConfig(**LLAMA_LIKE, logits_scaling=4.0)).eval()


def tiny_qwen2(seed: int = 0) -> Qwen2ForCausalLM:
    torch.manual_seed(seed)
    return Qwen2ForCausalLM(Qwen2Config(**LLAMA_LIKE)).eval()


def tiny_gemma2(seed: int = 0) -> Gemma2ForCausalLM:
    """Gemma-2's final logit soft-capping, tight enough to matter."""
    torch.manual_seed(seed)
    config = Gemma2Config(**LLAMA_LIKE, head_dim=16, final_logit_softcapping=0.5)
    return Gemma2ForCausalLM(config).eval()


MODELS = {"gpt2": tiny_gpt2, "qwen2": tiny_qwen2, "granite": tiny_granite, "gemma2": tiny_gemma2}


# Prompts of different lengths and responses of different lengths: right padding is exercised.
PROMPTS = [[1, 2, 3], [4, 5], [6, 7, 8, 9, 10], [11]]
RESPONSES = [[12, 13, 14, 15], [16, 17, 18, 19, 20, 21, 22], [23], [24, 25, 26]]


def logits_and_target(draw_v: int = 12):
    return st.lists(
        st.floats(-30, 30, allow_nan=False, width=32), min_size=2, max_size=draw_v
    ).flatmap(lambda z: st.tuples(st.just(z), st.integers(0, len(z) - 1)))


@settings(max_examples=60, deadline=None)
@given(zy=logits_and_target(), tau=st.sampled_from(TAUS))
def test_w_is_squared_logit_gradient_norm(zy, tau):
    z, y = zy
    logits = torch.tensor(z, dtype=torch.float64, requires_grad=True)
    # ‖∂ log softmax(z/τ)[y] / ∂z‖², z the raw logits.
    (grad,) = torch.autograd.grad(torch.log_softmax(logits / tau, -1)[y], logits)
    w = stats_from_logits(logits.detach(), torch.tensor(y), tau).w
    assert w.dtype == torch.float32
    torch.testing.assert_close(w.double(), grad.square().sum(), atol=1e-6, rtol=1e-4)


@settings(max_examples=60, deadline=None)
@given(zy=logits_and_target(), tau=st.sampled_from(TAUS))
def test_w_bounds(zy, tau):
    z, y = zy
    s = stats_from_logits(torch.tensor(z), torch.tensor(y), tau)
    w = s.w.double() * tau**2  # the τ = 1 proxy of the tempered distribution
    p = torch.softmax(torch.tensor(z, dtype=torch.float64) / tau, -1)[y]
    tol = 1e-5
    assert 0 <= w <= 2 + tol  # < 2 exactly; fp32 rounds 2 − ε up when p underflows
    assert w <= 2 * (1 - p) ** 2 + tol  # all other mass on one token
    assert w >= (1 - p) ** 2 + (1 - p) ** 2 / (len(z) - 1) - tol  # spread uniformly


def float64_reference(z: torch.Tensor, y: torch.Tensor) -> dict[str, torch.Tensor]:
    logp = torch.log_softmax(z.double(), -1)
    pi = logp.exp()
    p = logp.gather(-1, y[:, None])[:, 0].exp()
    return {
        "logprob": logp.gather(-1, y[:, None])[:, 0],
        "sum_pi2": pi.square().sum(-1),
        "entropy": -(pi * logp.nan_to_num(neginf=0.0)).sum(-1),
        "w": 1 - 2 * p + pi.square().sum(-1),
    }


def test_extreme_and_infinite_logits():
    inf = float("inf")
    z = torch.tensor(
        [
            [1e4, -1e4, 1e4 - 1.0, 0.0],
            [-1e4, -1e4, -1e4, -1e4 + 2.0],
            [0.0, -inf, 3.0, -inf],
            [-inf, -inf, 5.0, -inf],
            [-inf, 1e4, -1e4, -inf],
        ]
    )
    y = torch.tensor([2, 3, 0, 2, 1])
    s = stats_from_logits(z, y)
    ref = float64_reference(z, y)
    for name, expected in ref.items():
        got = getattr(s, name)
        assert torch.isfinite(got).all(), name
        torch.testing.assert_close(got.double(), expected, atol=1e-5, rtol=1e-5)
    # A target of probability zero: log p = -inf, p = 0, w = 1 + Σπ², still no NaN.
    s0 = stats_from_logits(torch.tensor([0.0, -inf, 1.0]), torch.tensor(1))
    assert s0.logprob == -inf and s0.prob == 0
    torch.testing.assert_close(s0.w, 1 + s0.sum_pi2)


def test_half_precision_logits_give_fp32_stats():
    z = torch.randn(3, 5, V, generator=torch.Generator().manual_seed(0)) * 4
    y = torch.randint(V, (3, 5), generator=torch.Generator().manual_seed(1))
    for dtype in (torch.bfloat16, torch.float16):
        s = stats_from_logits(z.to(dtype), y, 0.7)
        ref = stats_from_logits(z.to(dtype).float(), y, 0.7)
        assert s.w.dtype == torch.float32 and s.w.shape == (3, 5)
        torch.testing.assert_close(s.w, ref.w)


@pytest.mark.usefixtures("torch_threads")
@pytest.mark.parametrize("arch", ["gpt2", "granite"])
@pytest.mark.parametrize("tau", TAUS)
def test_untied_output_layer_gradient_is_w_times_h_sq(arch, tau):
    model = MODELS[arch](seed=1)
    prompt, response = [3, 1, 4, 1], [5, 9, 2, 6, 5]
    ids, mask, start = pad_batch([prompt], [response])
    s = response_token_stats(model, ids, mask, start, tau)
    logits = model(input_ids=ids).logits[0]
    for t in range(1, len(response) + 1):  # 1-based, theory.md's indexing
        logp = torch.log_softmax(logits[len(prompt) + t - 2] / tau, -1)[response[t - 1]]
        (grad,) = torch.autograd.grad(logp, model.lm_head.weight, retain_graph=True)
        expected = grad.square().sum()  # ‖∂ log p_t / ∂U‖²_F
        assert_close_to_norm(s.w[0, t - 1] * s.h_sq[0, t - 1], expected, rel=1e-4, msg=f"t={t}")


def naive_logprobs(model, prompt: list[int], response: list[int], tau: float) -> torch.Tensor:
    """log p_t by the book: the full logits of the unpadded row, position P + t − 2 for y_t."""
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([prompt + response])).logits[0]
    P = len(prompt)
    return torch.stack(
        [
            torch.log_softmax(logits[P + t - 2] / tau, -1)[response[t - 1]]
            for t in range(1, len(response) + 1)
        ]
    )


@pytest.mark.parametrize("arch", sorted(MODELS))
def test_alignment_matches_naive_logits_with_right_padding(arch):
    model = MODELS[arch](seed=2)
    taus = torch.tensor([1.0, 0.7, 1.5, 1.0])
    ids, mask, start = pad_batch(PROMPTS, RESPONSES)
    s = response_token_stats(model, ids, mask, start, taus, chunk_size=3)
    for i, (prompt, response) in enumerate(zip(PROMPTS, RESPONSES, strict=True)):
        T = len(response)
        expected = naive_logprobs(model, prompt, response, float(taus[i]))
        torch.testing.assert_close(s.logprob[i, :T], expected, atol=1e-5, rtol=1e-5)
        assert (s.w[i, T:] == 0).all() and (s.logprob[i, T:] == 0).all()


def test_alignment_on_a_model_that_copies_its_input():
    """A model whose logits at position j are a one-hot of the token at j (embedding = identity,
    no layers' contribution): it predicts y_t = the previous token, so only the correct shift
    gives probability ≈ 1 on a response that repeats one token."""
    model = LlamaForCausalLM(
        LlamaConfig(
            vocab_size=8,
            hidden_size=8,
            intermediate_size=8,
            num_hidden_layers=1,
            num_attention_heads=1,
            num_key_value_heads=1,
            tie_word_embeddings=False,
        )  # fmt: skip
    ).eval()
    with torch.no_grad():
        for p in model.model.layers.parameters():
            p.zero_()  # every block adds 0: the residual stream is the embedding
        model.model.embed_tokens.weight.copy_(torch.eye(8) * 8**0.5)  # RMS norm keeps one-hots
        model.model.norm.weight.fill_(1.0)
        model.lm_head.weight.copy_(torch.eye(8) * 20)
    ids, mask, start = pad_batch([[1, 2, 3], [4]], [[3, 3, 3], [4, 5, 5]])
    s = response_token_stats(model, ids, mask, start)
    assert (s.prob[0] > 0.99).all()  # y_t = 3 follows a 3 at every step
    assert s.prob[1, 0] > 0.99 and s.prob[1, 1] < 0.01 and s.prob[1, 2] > 0.99


@pytest.mark.usefixtures("torch_threads")
def test_chunking_and_batching_do_not_change_results():
    model = tiny_gpt2(seed=3)
    ids, mask, start = pad_batch(PROMPTS, RESPONSES)
    T = max(map(len, RESPONSES))
    ref = response_token_stats(model, ids, mask, start, 0.7, chunk_size=10_000)
    for chunk in (1, 3, T, 4 * T):
        s = response_token_stats(model, ids, mask, start, 0.7, chunk_size=chunk)
        for name in ("logprob", "prob", "sum_pi2", "entropy", "w", "h_sq"):
            assert_close_to_norm(getattr(s, name), getattr(ref, name), rel=1e-5, msg=name)
    # One row at a time, without padding, through the token-budget batching path.
    singles = stats_for_sequences(model, PROMPTS, RESPONSES, 0.7, batch_tokens=1)
    for i, one in enumerate(singles):
        T_i = len(RESPONSES[i])
        assert one.w.shape == (T_i,)
        assert_close_to_norm(one.w, ref.w[i, :T_i], rel=1e-5, msg="w")
        assert_close_to_norm(one.logprob, ref.logprob[i, :T_i], rel=1e-5, msg="logprob")


def test_bf16_model_gives_fp32_stats_close_to_fp32_model():
    model = tiny_gpt2(seed=4)
    ids, mask, start = pad_batch(PROMPTS, RESPONSES)
    ref = response_token_stats(model, ids, mask, start)
    s = response_token_stats(model.to(torch.bfloat16), ids, mask, start)
    assert s.w.dtype == torch.float32 and s.logprob.dtype == torch.float32
    torch.testing.assert_close(s.logprob, ref.logprob, atol=0.05, rtol=0.02)
    torch.testing.assert_close(s.w, ref.w, atol=0.02, rtol=0.02)


def test_tied_model_and_training_mode_restored():
    model = tiny_gpt2(seed=5, tied=True).train()  # dropout on: must be switched off, then back
    ids, mask, start = pad_batch(PROMPTS, RESPONSES)
    a = response_token_stats(model, ids, mask, start)
    b = response_token_stats(model, ids, mask, start)
    assert model.training
    torch.testing.assert_close(a.logprob, b.logprob)
    expected = naive_logprobs(model.eval(), PROMPTS[1], RESPONSES[1], 1.0)
    torch.testing.assert_close(a.logprob[1, : len(RESPONSES[1])], expected, atol=1e-5, rtol=1e-5)


def test_unsupported_head_is_refused():
    model = tiny_gpt2(seed=6)
    model.config.logits_scaling = 4.0  # claims a scaling the GPT-2 head does not apply
    with pytest.raises(InputError, match="differ from the model's own"):
        check_output_layer(model)


def autocast_forward(model: torch.nn.Module, dtype: torch.dtype) -> torch.nn.Module:
    """`model` with its `forward` run under autocast to `dtype`, as accelerate wraps a
    `bf16=True` (`fp16=True`) trainer's model: a caller cannot switch that autocast off."""
    forward = model.forward
    model.forward = torch.autocast("cpu", dtype=dtype)(forward)
    return model


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_a_head_run_under_autocast_passes_the_check(dtype):
    """The model's logits come from a half-precision product (they differ from the fp32 rebuild
    by ~0.03 on this model, 300 times the fp32 tolerance), and the check's tolerance follows the
    precision the head ran in; an autocast around the check itself is switched off."""
    for make in MODELS.values():
        model = autocast_forward(make(seed=7), dtype)
        check_output_layer(model)
        with torch.autocast("cpu", dtype=dtype):
            check_output_layer(make(seed=7))  # a caller's own autocast: the probe runs in fp32


def test_an_unsupported_head_under_autocast_is_still_refused():
    model = autocast_forward(tiny_gpt2(seed=6), torch.bfloat16)
    model.config.logits_scaling = 4.0  # the rebuild divides by 4, the model does not
    with pytest.raises(InputError, match=r"ran in bfloat16, tolerance 0\.03"):
        check_output_layer(model)


def test_bad_inputs_are_refused():
    model = tiny_gpt2()
    ids, mask, start = pad_batch(PROMPTS, RESPONSES)
    with pytest.raises(InputError, match="right-padded"):
        response_token_stats(model, ids, mask.flip(-1), start, check_head=False)
    with pytest.raises(InputError, match="response_start"):
        response_token_stats(model, ids, mask, torch.zeros(4, dtype=torch.long), check_head=False)


@settings(max_examples=100, deadline=None)
@given(
    lengths=st.lists(st.integers(0, 50), max_size=30),
    budget=st.integers(1, 200),
)
def test_pack_by_tokens_respects_budget_and_covers_all(lengths, budget):
    batches = pack_by_tokens(lengths, budget)
    assert sorted(i for b in batches for i in b) == list(range(len(lengths)))
    for b in batches:
        cost = len(b) * max(lengths[i] for i in b)
        assert cost <= budget or len(b) == 1  # only a lone over-long sequence may exceed it
    assert batches == pack_by_tokens(lengths, budget)


def test_cumulative_energy_hand_case():
    w = torch.tensor([[0.5, 1.0, 0.25, 2.0, 0.0], [1.0, 1.0, 1.0, 1.0, 1.0]])
    mask = torch.tensor([[1, 0, 1, 1, 0], [0, 1, 1, 0, 0]])
    W = cumulative_energy(w, mask)
    expected = torch.tensor([[0.5, 0.5, 0.75, 2.75, 2.75], [0.0, 1.0, 2.0, 2.0, 2.0]])
    torch.testing.assert_close(W, expected)
    torch.testing.assert_close(sequence_energy(w, mask.bool()), torch.tensor([2.75, 2.0]))


def test_stats_plan_from_a_given_free_memory():
    model = tiny_gpt2()  # V = 50, d = 32: a chunk row is 2 · 4 · 50 = 400 bytes, a token 2 KiB
    assert stats_plan(model) == (STATS_CHUNK, BATCH_TOKENS)  # the CPU's sizes when not told
    # 4 GiB free, a quarter each: 2^30 / 400 → 2^21, capped at 4096; 2^30 / 2048 = 2^19 tokens,
    # capped at 2^15
    assert stats_plan(model, free_bytes=4 * 2**30) == (MAX_STATS_CHUNK, MAX_BATCH_TOKENS)
    assert (MAX_STATS_CHUNK, MAX_BATCH_TOKENS) == (4096, 2**15)
    # 2 MiB free: 512 KiB / 400 B = 1310 rows → 1024; 512 KiB / 2 KiB = 256 tokens → the floor
    assert stats_plan(model, free_bytes=2 * 2**20) == (1024, BATCH_TOKENS)
    assert stats_plan(model, free_bytes=0) == (STATS_CHUNK, BATCH_TOKENS)


@pytest.mark.usefixtures("torch_threads")
def test_checkpoint_stats_is_the_per_row_statistics_on_a_padded_grid():
    model = tiny_gpt2(seed=6)
    width = max(map(len, RESPONSES)) + 2  # the batch's width may exceed its longest response
    ids = torch.tensor([r + [0] * (width - len(r)) for r in RESPONSES])
    batch = SimpleNamespace(
        prompt_ids=PROMPTS, response_ids=ids, length=torch.tensor([len(r) for r in RESPONSES]),
        temperature=torch.tensor([0.7, 1.0, 1.3, 2.0]),
    )  # fmt: skip
    grid = checkpoint_stats(model, batch, batch_tokens=9, chunk_size=2)
    rows = stats_for_sequences(model, PROMPTS, RESPONSES, [0.7, 1.0, 1.3, 2.0])
    for name in ("logprob", "prob", "sum_pi2", "entropy", "w", "h_sq"):
        value = getattr(grid, name)
        assert value.shape == (4, width) and value.device.type == "cpu"
        for i, one in enumerate(rows):
            n = len(RESPONSES[i])
            assert_close_to_norm(value[i, :n], getattr(one, name), rel=1e-5, msg=name)
            assert (value[i, n:] == 0).all()


def test_dtype_auto_keeps_a_bf16_checkpoint_in_bf16_with_fp32_statistics(tmp_path):
    """`--dtype auto` (the default): a checkpoint saved in bf16 loads in bf16, and its statistics
    come out fp32, within bf16 rounding of the same weights run in fp32."""
    model = tiny_model(seed=7).to(torch.bfloat16)
    model.save_pretrained(tmp_path)
    char_tokenizer().save_pretrained(tmp_path)
    loaded = load_checkpoint(tmp_path, dtype="auto").model
    assert loaded.dtype == torch.bfloat16
    assert LoadOptions(device="cpu").load(tmp_path).model.dtype == torch.bfloat16  # the CLI's
    prompts, responses = [[1, 2, 3], [4, 5]], [[6, 7, 8, 9], [10, 11]]
    ids = torch.tensor([r + [0] * (4 - len(r)) for r in responses])
    batch = SimpleNamespace(prompt_ids=prompts, response_ids=ids, length=torch.tensor([4, 2]),
                            temperature=torch.ones(2))  # fmt: skip
    got, ref = checkpoint_stats(loaded, batch), checkpoint_stats(model.float(), batch)
    for name in ("logprob", "w", "sum_pi2", "entropy"):
        assert getattr(got, name).dtype == torch.float32
        assert_close_to_norm(getattr(got, name), getattr(ref, name), rel=5e-2, msg=name)
