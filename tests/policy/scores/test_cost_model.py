"""The cost model of `full` mode (policy/scores/cost.py): it refuses over budget unless forced
and what does not fit in memory, packs small batches, and picks the engine by counted work."""

from __future__ import annotations

import math

import pytest
import torch
from test_full_engines import gpt2
from test_token_scores import RESPONSES, make_batch
from torch import nn

from otb_diag.errors import InputError
from otb_diag.policy.scores import cost as full_cost
from otb_diag.policy.scores import forward_mode as scores_forward_module
from otb_diag.policy.scores import token_scores as scores_module
from otb_diag.policy.scores.directions import Block, select_parameters
from otb_diag.policy.scores.token_scores import token_scores


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
        monkeypatch.setattr(full_cost, "device_seconds", lambda _d, c=clock, t=tick: next(c) * t)
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


def test_attention_scores_are_planned_from_the_free_memory() -> None:
    """`SCORE_BUFFERS` fp32 scores for the primal and each of 8 tangents in `ATTENTION_SHARE`:
    72 bytes a score; a GPU with 8 GiB free gets 2^⌊log2(0.1 · 8 GiB / 72)⌋ = 2^23 scores, one with
    80 GiB 2^26, one with 1 TiB the cap 2^28, a nearly full one the CPU's `SCORES_PER_CHUNK` (the
    floor), and the CPU always that."""
    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    assert full_cost.SCORE_BUFFERS * 4 * (1 + 8) == 72
    assert full_cost.scores_chunk_for(cuda, 8 * 2**30, 8) == 2**23
    assert full_cost.scores_chunk_for(cuda, 80 * 2**30, 8) == 2**26
    assert full_cost.scores_chunk_for("cuda", 2**40, 8) == full_cost.MAX_SCORES_PER_CHUNK == 2**28
    assert full_cost.scores_chunk_for(cuda, 2**20, 8) == full_cost.SCORES_PER_CHUNK
    assert full_cost.scores_chunk_for(cpu, 80 * 2**30, 8) == full_cost.SCORES_PER_CHUNK
    # fewer directions, more scores: 2 tangents are 24 bytes a score, 2^⌊log2(0.1 · 2 GiB / 24)⌋
    assert full_cost.scores_chunk_for(cuda, 2 * 2**30, 2) == 2**23
    assert full_cost.scores_chunk_for(cuda, 2 * 2**30, 8) == 2**21


def test_head_chunk_is_planned_from_the_free_memory() -> None:
    """`HEAD_BUFFERS` fp32 `[chunk, V]` buffers in `HEAD_SHARE` of what is available: V = 151,936
    is 1.82 MB a token; a GPU with 8 GiB free gets 2^⌊log2(0.1 · 8 GiB / 1.82 MB)⌋ = 256 tokens, one
    with 80 GiB 4096 (the cap), the CPU at most `HEAD_CHUNK`, and a nearly full device the floor."""
    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    per_token = full_cost.HEAD_BUFFERS * 4 * 151_936
    assert per_token == 1_823_232
    assert full_cost.head_chunk_for(cuda, 151_936, 8 * 2**30) == 256
    assert full_cost.head_chunk_for(cuda, 151_936, 80 * 2**30) == 4096
    assert full_cost.head_chunk_for(cpu, 151_936, 80 * 2**30) == scores_forward_module.HEAD_CHUNK
    assert full_cost.head_chunk_for(cuda, 151_936, 2**20) == full_cost.MIN_HEAD_CHUNK
    model, batch = gpt2(), make_batch()
    planned = plan(model, batch, engine="jvp", budget_s=None, available_bytes=1e12)
    assert planned.head_chunk == scores_forward_module.HEAD_CHUNK  # the CPU's cap
    # 3 rows · 2 heads · 8 positions: all the scores of the batch are fewer than a CPU chunk
    assert planned.attention_scores == 3 * 2 * 8 * 8
    assert plan(model, batch, engine="jvp", budget_s=None, head_chunk=3).head_chunk == 3


def test_calibration_call_takes_the_devices_calibration_size(monkeypatch) -> None:
    """The timed calibration call takes `calibration_tokens(device)` padded tokens: 256 on the
    CPU, and on a GPU whole rows up to 4,096, as a real call does (a short call times a GPU's
    launch overhead: the estimate was 1.6-5.3x over on an H200, issue 41)."""
    assert full_cost.calibration_tokens(torch.device("cpu")) == full_cost.CALIBRATION_TOKENS == 256
    assert full_cost.calibration_tokens(torch.device("cuda")) == 4096
    model, batch = gpt2(), make_batch()
    timed: list[list[int]] = []
    real = full_cost.forward_scores

    def spy(model, cal, *args, **kwargs):
        timed.append(cal.length.tolist())
        return real(model, cal, *args, **kwargs)

    monkeypatch.setattr(full_cost, "forward_scores", spy)
    for size in (4, 4096):  # a cut of the longest row; every row, whole
        monkeypatch.setattr(full_cost, "calibration_tokens", lambda device, size=size: size)
        plan(model, batch, engine="jvp", budget_s=None)
    longest = max(len(r) for r in RESPONSES)
    cut, whole = timed[1], timed[3]  # each plan: a warm-up call, then the timed one
    assert cut == [4]
    assert sorted(whole) == sorted(len(r) for r in RESPONSES) and max(whole) == longest


def test_forward_estimate_extrapolates_the_cost_per_token_in_the_row_length(monkeypatch) -> None:
    """A clock on which a call of `d` directions over `r` rows of `L` tokens takes
    `d · r · L · (a + b·L)` seconds: the two calibration cuts (3 and 6 tokens long here) recover
    `a` and `b`, and the estimate is `K · Σ_g padded_g · (a + b·L_g)`: here one packed batch of
    3 rows of 8 tokens, K = 8."""
    a, b = 1e-3, 1e-4
    clock = [0.0]

    def fake_forward(model, cut, params, blocks, seed, **run) -> None:
        length = max(len(p) + int(t) for p, t in zip(cut.prompt_ids, cut.length, strict=True))
        clock[0] += blocks[0].k * len(cut.prompt_ids) * length * (a + b * length)

    monkeypatch.setattr(full_cost, "forward_scores", fake_forward)
    monkeypatch.setattr(full_cost, "device_seconds", lambda device: clock[0])
    monkeypatch.setattr(full_cost, "calibration_tokens", lambda device: 1)
    model, batch = gpt2(), make_batch()
    planned = plan(model, batch, engine="jvp", budget_s=None)
    assert planned.calibration["forward_s_per_direction_token_per_key"] == pytest.approx(b)
    assert planned.calibration["forward_calibration_length"] == 3  # prompt 2 + 1 token
    assert planned.forward_s == pytest.approx(8 * 3 * 8 * (a + b * 8))
