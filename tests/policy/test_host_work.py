"""What a pass costs the host, bounded by constants that do not grow with rows or chunks (issue
48: on a GPU the statistics pass was bound by the host, 111 ms of CPU for 85 ms of CUDA, because
every `checkpoint_stats` call ran the whole backbone twice, `check_output_layer`'s probe and then
the pass). Counted on the CPU: backbone forwards by a hook on `model.base_model`, and host reads
of device tensors (`item`, `tolist`, `bool()`, `cpu()`..., each a wait for a GPU's queue) with
the model's weights on a simulated `cuda:0` (tests/virtual_devices.py)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pytest
import torch
from test_forward_pass import tiny_gpt2, tiny_qwen2
from test_placement import batch_of, make_batch
from virtual_devices import virtual_devices

from otb_diag.maths.energy.token_stats import TokenStats
from otb_diag.maths.response_batch import ResponseBatch
from otb_diag.policy.forward_pass import checkpoint_stats, final_hidden, pad_batch
from otb_diag.policy.scores.directions import Block, select_parameters
from otb_diag.policy.scores.forward_mode import forward_scores
from otb_diag.policy.scores.token_scores import token_scores

MODELS = {"gpt2": tiny_gpt2, "qwen2": tiny_qwen2}
STATISTICS = len(TokenStats.__dataclass_fields__)  # grids copied off the device, one read each


def rows_batch(rows: int) -> ResponseBatch:
    """`rows` responses of 3 to 8 tokens after prompts of 1 to 3 (ids below 50)."""
    prompts = [[1 + i % 7] * (1 + i % 3) for i in range(rows)]
    responses = [[(5 * i + t) % 49 + 1 for t in range(3 + i % 6)] for i in range(rows)]
    return batch_of(prompts, responses, [0.9] * rows)


@contextmanager
def backbone_forwards(model: torch.nn.Module) -> Iterator[list[tuple[int, ...]]]:
    """The input shapes of every forward of `model.base_model` inside the block."""
    shapes: list[tuple[int, ...]] = []

    def record(_module, args, kwargs, _out) -> None:  # noqa: ANN001
        ids = kwargs["input_ids"] if "input_ids" in kwargs else args[0]
        shapes.append(tuple(ids.shape))

    hook = model.base_model.register_forward_hook(record, with_kwargs=True)
    try:
        yield shapes
    finally:
        hook.remove()


@pytest.mark.parametrize("arch", MODELS)
def test_a_statistics_pass_runs_the_backbone_once_per_call(arch) -> None:
    """The output layer is checked once per model (`check_output_layer`'s probe, 1 × 8 tokens),
    then every call is one forward of its packed batch, whatever its rows; a change that can
    change the verdict (another dtype, a wrapped forward) checks again."""
    model = MODELS[arch]()
    with backbone_forwards(model) as shapes:
        checkpoint_stats(model, rows_batch(4))
    assert shapes[0] == (1, 8) and len(shapes) == 2  # the probe, then the pass
    for rows in (1, 4, 16):
        with backbone_forwards(model) as shapes:
            checkpoint_stats(model, rows_batch(rows))
            token_scores(model, rows_batch(rows), "head", 4, seed=0)
        assert [s[0] for s in shapes] == [rows, rows]  # no probe: one forward per pass
    model.to(torch.float64)
    with backbone_forwards(model) as shapes:
        checkpoint_stats(model, rows_batch(2))
    assert shapes[0] == (1, 8)  # checked again in the new dtype
    forward = model.forward
    model.forward = lambda *args, **kwargs: forward(*args, **kwargs)  # as accelerate wraps it
    with backbone_forwards(model) as shapes:
        checkpoint_stats(model, rows_batch(2))
    assert shapes[0] == (1, 8)


def reads_of(model: torch.nn.Module, run: Callable[[], object]) -> list[str]:
    """The host reads of device tensors made by `run()`, the model on a simulated `cuda:0`."""
    with virtual_devices() as devices:
        devices.place(model, "cuda")
        run()
        return devices.reads


@pytest.mark.parametrize("arch", MODELS)
def test_host_reads_of_a_pass_do_not_grow_with_rows_or_chunks(arch) -> None:
    """A checked model's statistics pass reads the device only where its backbone's own code
    does (transformers' mask checks: `bare`, what `final_hidden` alone reads) and once per
    statistic to copy its grids off; head mode once for its scores and once for their norms.
    The same for 1, 4 and 16 rows and for chunks of 1, 4 and 64 tokens (up to 150 chunks)."""
    model = MODELS[arch]()
    reads_of(model, lambda: checkpoint_stats(model, make_batch([1.0] * 3)))  # checked, once
    ids, mask, _ = pad_batch([[1]], [[2, 3]])
    bare = reads_of(model, lambda: final_hidden(model, ids, mask))
    for rows in (1, 4, 16):
        for chunk in (1, 4, 64):
            batch = rows_batch(rows)
            stats = reads_of(
                model, lambda b=batch, c=chunk: checkpoint_stats(model, b, chunk_size=c)
            )
            assert sorted(stats) == sorted(bare + ["cpu"] * STATISTICS), (rows, chunk)
            head = reads_of(
                model, lambda b=batch, c=chunk: token_scores(model, b, "head", 4, 0, chunk_size=c)
            )
            assert sorted(head) == sorted(bare + ["cpu"] * 2), (rows, chunk)


@pytest.mark.parametrize(("scores", "reads"), [(1 << 20, 0), (40, 1)], ids=["one", "several"])
def test_forward_mode_reads_its_query_chunks_keys_once_a_forward(scores, reads) -> None:
    """Forward mode's query-chunked attention reads which keys each chunk needs off the device
    once per forward, for all its layers (they share the mask), and not at all when one chunk
    holds every query row; it read them once per layer (issue 41's one read per call, made in
    each of 28 layers on Qwen2.5-1.5B). Two layers, 4 directions 2 at a time: 2 forwards. The
    scores are copied off the device once, at the end, not after each call (a functorch
    output has no label, so a per-call copy would not be counted here: the grid's is)."""
    model, batch = tiny_qwen2(), rows_batch(3)

    def run() -> None:
        params = select_parameters(model, None)
        blocks = [Block("all", tuple(params), 4, 0)]
        forward_scores(
            model, batch, params, blocks, 0, batch_tokens=4096, directions_batch=2,
            attention_scores=scores,
        )  # fmt: skip

    assert model.config.num_hidden_layers == 2
    assert reads_of(model, run) == ["tolist"] * 2 * reads + ["cpu"]  # the scores, copied once
