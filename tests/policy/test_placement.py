"""Every public entry of policy/ takes its tensors on any device (`policy/placement.py`), proved on
the CPU with the model's weights on a simulated `cuda:0` (tests/virtual_devices.py: each torch
call checks its tensors' devices as a GPU's kernels do). Issue 48's three CUDA failures were
`response_token_stats` given `response_start` on the CPU and `input_ids` on CUDA; here the same
mix fails the old code at its first comparison (`start > n_real`), and the surrogate loss, head
sketch, proxy scores and `final_hidden` failed the same way before their entries moved their
inputs. Each entry's result is also the CPU's: the same numbers, on the device its docstring says.
"""

from __future__ import annotations

import itertools

import pytest
import torch
from test_forward_pass import tiny_gpt2, tiny_qwen2
from virtual_devices import CPU, DeviceMix, virtual_devices

from otb_diag.maths.response_batch import ResponseBatch, pad
from otb_diag.policy.forward_pass import (
    checkpoint_stats,
    final_hidden,
    pad_batch,
    response_token_stats,
    stats_for_sequences,
)
from otb_diag.policy.noise import GlobalRng, RowNoise
from otb_diag.policy.sampling import Sampling, sample_batch
from otb_diag.policy.scores.token_scores import (
    head_sketch_from_hidden,
    head_sketch_of,
    proxy_scores,
    token_scores,
)
from otb_diag.policy.surrogate_loss import surrogate_loss

CUDA = torch.device("cuda", 0)
PROMPTS = [[1, 2, 3], [4], [5, 6]]
RESPONSES = [[7, 8, 9, 10], [11, 12], [0, 3, 5, 7, 9, 11]]
MODELS = {"gpt2": tiny_gpt2, "qwen2": tiny_qwen2}


def make_batch(temperature: list[float]) -> ResponseBatch:
    """PROMPTS / RESPONSES as a `ResponseBatch` (the fields the passes read), on the CPU."""
    return batch_of(PROMPTS, RESPONSES, temperature)


def batch_of(
    prompts: list[list[int]], responses: list[list[int]], temperature: list[float]
) -> ResponseBatch:
    """A `ResponseBatch` of the fields the passes read, on the CPU."""
    n, length = len(responses), torch.tensor([len(r) for r in responses])
    valid = torch.arange(int(length.max()))[None] < length[:, None]
    return ResponseBatch(
        group_names=["g"], group=torch.zeros(n, dtype=torch.long), sample=torch.arange(n),
        length=length, prompt_ids=prompts,
        response_ids=pad(responses, int(length.max()), 0, torch.long), valid=valid,
        mask=valid.float(), token_rewards=torch.zeros(valid.shape), reward=torch.zeros(n),
        temperature=torch.tensor(temperature), step=[None] * n, is_weights=None, logprobs=None,
        sum_pi2=None,
    )  # fmt: skip


def same(a: torch.Tensor, b: torch.Tensor) -> None:
    """The simulated device computes on the CPU: the same numbers up to the chunking that a
    CUDA plan may choose (`stats_plan`), within a few ulps."""
    torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_the_simulation_refuses_what_a_gpu_refuses() -> None:
    """The harness itself: a CUDA/CPU mix raises torch's message; a 0-dim CPU tensor, CPU
    indices and copies between devices pass, as on a GPU; `.device` answers the label."""
    with virtual_devices() as devices:
        a = devices.place(torch.ones(3), "cuda")
        b = devices.place(torch.ones(3), "cpu")
        with pytest.raises(DeviceMix, match="Expected all tensors to be on the same device"):
            a + b
        assert (a + b.sum()).device == CUDA  # a 0-dim CPU tensor mixes
        assert a[torch.tensor([0, 2])].device == CUDA  # CPU indices
        with pytest.raises(DeviceMix):
            b[devices.place(torch.tensor([0]), "cuda")]  # device indices into a CPU tensor
        with pytest.raises(DeviceMix):
            a[torch.tensor([0, 1])] = b[:2]  # CPU values into a device tensor
        assert b.to(a.device).device == CUDA and a.cpu().device == CPU
        assert torch.zeros(2, device="cuda").device == CUDA and torch.zeros(2).device == CPU
        assert devices.reads == ["cpu"]  # a.cpu() read the device


@pytest.mark.parametrize("arch", MODELS)
@pytest.mark.parametrize(
    "on_cpu",
    [(), ("start",), ("mask", "start"), ("start", "temperature"), ("ids",), ("ids", "start")],
    ids=lambda names: "+".join(names) or "none",
)
def test_response_token_stats_takes_its_inputs_on_any_device(arch, on_cpu) -> None:
    """The model on `cuda:0`, each input on the CPU or the device (`on_cpu` names those left on
    the CPU): the same statistics as on the CPU, on the model's device. The `start` cases are
    issue 48's failure (`forward_pass.py:325`, `response_start` on the CPU)."""
    model = MODELS[arch]()
    ids, mask, start = pad_batch(PROMPTS, RESPONSES)
    tau = torch.tensor([0.7, 1.0, 1.3])
    want = response_token_stats(model, ids, mask, start, tau)
    with virtual_devices() as devices:
        devices.place(model, "cuda")
        given = {"ids": ids, "mask": mask, "start": start, "temperature": tau}
        for name, tensor in given.items():
            devices.place(tensor, "cpu" if name in on_cpu else "cuda")
        got = response_token_stats(model, ids, mask, start, tau)
        assert {devices.device_of(t) for t in vars(got).values()} == {CUDA}
    for name, value in vars(want).items():
        same(getattr(got, name), value)


def test_final_hidden_sends_host_ids_to_the_backbone() -> None:
    model = tiny_qwen2()
    ids, mask, _ = pad_batch(PROMPTS, RESPONSES)
    want = final_hidden(model, ids, mask)
    with virtual_devices() as devices:
        devices.place(model, "cuda")
        devices.place((ids, mask), "cpu")
        got = final_hidden(model, ids, mask)
        assert devices.device_of(got) == CUDA
    same(got, want)


@pytest.mark.parametrize("batch_on", ["cpu", "cuda"])
def test_statistics_pass_takes_a_batch_on_any_device(batch_on) -> None:
    """`checkpoint_stats` and `stats_for_sequences` (temperatures as a device tensor): CPU
    grids, the CPU's numbers, whether the batch came on the host or on the device."""
    model, batch = tiny_gpt2(), make_batch([0.7, 1.0, 1.3])
    want = checkpoint_stats(model, batch)
    want_rows = stats_for_sequences(model, PROMPTS, RESPONSES, batch.temperature)
    with virtual_devices() as devices:
        devices.place(model, "cuda")
        devices.place(batch, batch_on)
        got = checkpoint_stats(model, batch)
        rows = stats_for_sequences(model, PROMPTS, RESPONSES, batch.temperature)
        assert {devices.device_of(t) for t in vars(got).values()} == {CPU}
    for name, value in vars(want).items():
        same(getattr(got, name), value)
        for row, want_row in zip(rows, want_rows, strict=True):
            same(getattr(row, name), getattr(want_row, name))


@pytest.mark.parametrize(("mode", "engine"), [("head", "auto"), ("full", "jvp"), ("full", "vjp")])
@pytest.mark.parametrize("batch_on", ["cpu", "cuda"])
def test_token_scores_take_a_batch_on_any_device(mode, engine, batch_on) -> None:
    """Head mode and both full-mode engines (their plan and calibration included), the model on
    the device: scores on the CPU, the CPU's numbers (the simulated CUDA generator is a CPU one,
    so the directions are the CPU's too)."""
    model, batch = tiny_gpt2(), make_batch([0.7, 1.0, 1.3])
    kwargs = dict(engine=engine, budget_s=None)
    want = token_scores(model, batch, mode, 4, seed=3, **kwargs)
    with virtual_devices(free_bytes=2**30) as devices:
        devices.place(model, "cuda")
        devices.place(batch, batch_on)
        got = token_scores(model, batch, mode, 4, seed=3, **kwargs)
        assert devices.device_of(got.proj) == CPU and devices.device_of(got.sq_norm) == CPU
    same(got.proj, want.proj)
    same(got.sq_norm, want.sq_norm)


def test_head_sketch_from_hidden_takes_host_targets() -> None:
    """What a trainer's hook hands over: hidden states on the device, targets and temperatures
    wherever the trainer keeps them (here the CPU); the scores come back on the CPU."""
    model = tiny_gpt2()
    hidden = torch.randn(5, model.config.n_embd, generator=torch.Generator().manual_seed(0))
    targets, tau = torch.tensor([1, 4, 9, 2, 0]), torch.tensor([1.0, 0.7, 1.0, 1.3, 1.0])
    want = head_sketch_from_hidden(head_sketch_of(model, 4, 0), hidden, targets, tau, 2)
    with virtual_devices() as devices:
        devices.place(model, "cuda")
        devices.place(hidden, "cuda")
        devices.place((targets, tau), "cpu")
        got = head_sketch_from_hidden(head_sketch_of(model, 4, 0), hidden, targets, tau, 2)
        assert {devices.device_of(t) for t in got} == {CPU}
    for a, b in zip(got, want, strict=True):
        same(a, b)


def test_proxy_scores_stay_on_the_device_of_w() -> None:
    w = torch.rand(3, 6, generator=torch.Generator().manual_seed(1))
    want = proxy_scores(w, 8, 0)
    with virtual_devices() as devices:
        devices.place(w, "cuda")
        got = proxy_scores(w, 8, 0)
        assert devices.device_of(got) == CUDA
    same(got, want)


@pytest.mark.parametrize("advantages_on", ["cpu", "cuda"])
def test_surrogate_loss_runs_on_the_models_device(advantages_on) -> None:
    """A batch on the host, the model on the device (`train --device cuda`): the loss on the
    device, and its gradient the CPU's."""
    batch = make_batch([0.7, 1.0, 1.3])
    advantages = torch.linspace(-1, 1, batch.mask.numel()).view_as(batch.mask)

    def loss_and_grads(model):
        loss = surrogate_loss(model, batch, advantages, "token-mean")
        return loss, torch.autograd.grad(loss, list(model.parameters()))

    model = tiny_gpt2()
    want, want_grads = loss_and_grads(model)
    with virtual_devices() as devices:
        devices.place(model, "cuda")
        devices.place(batch, "cpu")
        devices.place(advantages, advantages_on)
        got, grads = loss_and_grads(model)
        assert devices.device_of(got) == CUDA
    same(got, want)
    for a, b in zip(grads, want_grads, strict=True):
        same(a, b)


@pytest.mark.parametrize("noise", ["rows", "global"])
def test_sampler_runs_on_the_models_device(noise) -> None:
    """Host prompt lists, the model on the device: the same samples as on the CPU."""
    model = tiny_gpt2()

    def sample():
        source = RowNoise([5, 6, 7]) if noise == "rows" else GlobalRng()
        torch.manual_seed(0)
        return sample_batch(
            model, PROMPTS, source, Sampling(1.0, 0, 1.0, 4), eos_ids=[49], pad_id=0
        )

    want = sample()
    with virtual_devices() as devices:
        devices.place(model, "cuda")
        got = sample()
    assert [s.response_ids for s in got] == [s.response_ids for s in want]
    for a, b in itertools.chain.from_iterable(
        zip(x.logprobs + x.sum_pi2, y.logprobs + y.sum_pi2, strict=True)
        for x, y in zip(got, want, strict=True)
    ):
        assert a == pytest.approx(b, rel=1e-5, abs=1e-6)
