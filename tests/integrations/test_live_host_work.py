"""What `attach`'s hooks cost the trainer's host, counted on the CPU: on a GPU each read of a
tensor to the host (`item`, `tolist`, `cpu`, `bool`) waits for the device and stalls the
launches queued behind it, so a read per micro-step or per row would grow with the batch. The
hooks on the training's critical path (`_start`, `_take` with the step's hand-over, `collect`)
read a step's tensors to the host a fixed number of times, whatever its micro-steps and rows:
the counts of a step with 4 micro-steps of 8 rows (32 rows a step) equal those of a step with
one micro-step of 8 rows. (What the live core measures runs in its worker process, off this
count and off the trainer's interpreter: test_worker.py.)"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.overrides import TorchFunctionMode
from trl_toy import toy_trainer

from otb_diag.integrations.trl import LiveDiagnostics, attach

READS = {torch.Tensor.item, torch.Tensor.tolist, torch.Tensor.cpu, torch.Tensor.__bool__}
# The hooks bench/bench_live.py times, and the step each runs in counted from the trainer's
# `global_step`: `collect` runs at `on_step_end`, after the trainer counted the step.
HOOKS = {"_start": 1, "_take": 1, "collect": 0}


class HostReads(TorchFunctionMode):
    """Counts the reads of `READS` made while it is active, per training step."""

    def __init__(self, step: int, counts: dict[int, int]) -> None:
        super().__init__()
        self.step, self.counts = step, counts

    def __torch_function__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        if func in READS:
            self.counts[self.step] = self.counts.get(self.step, 0) + 1
        return func(*args, **(kwargs or {}))


def reads_per_step(tmp_path: Path, accumulation: int, options: dict) -> dict[int, int]:
    """The host reads of the hooks at each of 3 steps, `accumulation` micro-steps a step."""
    counts: dict[int, int] = {}
    trainer = toy_trainer(tmp_path / str(accumulation), 3, gradient_accumulation_steps=accumulation)
    with pytest.MonkeyPatch.context() as patch:
        for name, ahead in HOOKS.items():
            hook: Callable[..., Any] = getattr(LiveDiagnostics, name)

            def counted(
                self: LiveDiagnostics, *args: Any, _hook: Callable = hook, _ahead: int = ahead
            ) -> Any:
                with HostReads(trainer.state.global_step + _ahead, counts):
                    return _hook(self, *args)

            patch.setattr(LiveDiagnostics, name, counted)
        live = attach(trainer, **options)
        trainer.train()
    assert live.enabled and trainer.state.global_step == 3
    return counts


@pytest.mark.slow  # trains 6 short TRL runs (~10 s)
@pytest.mark.parametrize(
    "options",
    [{"split_every": None}, {"split_every": 1}, {"advantages": "otb"}],
    ids=["default-without-split", "split-every-step", "otb-advantages"],
)
def test_host_reads_a_step_do_not_grow_with_micro_steps_or_rows(
    tmp_path: Path, options: dict
) -> None:
    one = reads_per_step(tmp_path, 1, options)
    four = reads_per_step(tmp_path, 4, options)
    assert sorted(one) == [1, 2, 3]
    assert four == one
