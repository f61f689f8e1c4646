"""The rank rules of runtime/torchrun.py without launching ranks: a phase decorated with
`agreed` is a plain call in a world of one; with other ranks (their all_gather simulated) every
rank raises the first failing rank's error, an input error as itself; `share` and `on_main`."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from otb_diag.errors import InputError
from otb_diag.runtime import torchrun
from otb_diag.runtime.torchrun import Dist, DistributedError, agreed, shard_by_tokens


@dataclass(frozen=True)
class Simulated(Dist):
    """Rank `rank` of a world whose other ranks report `others` (rank → failure or None)."""

    others: tuple = ()

    def all_gather(self, obj):
        return [obj if r == self.rank else self.others[r] for r in range(self.world_size)]


@agreed
def halve(x: int) -> float:
    if x < 0:
        raise InputError("negative", field="x")
    if x == 0:
        raise ZeroDivisionError("zero")
    return x / 2


def test_a_world_of_one_calls_the_phase_plainly() -> None:
    assert halve(4) == 2.0
    with pytest.raises(InputError, match="negative"):
        halve(-1)
    assert halve.__name__ == "halve" and halve.__wrapped__(6) == 3.0


def test_every_rank_raises_the_first_failing_ranks_error(monkeypatch) -> None:
    other = InputError("rank 0's bad row", field="reward")
    monkeypatch.setattr(torchrun, "_current", Simulated(1, 3, (("input", other), None, None)))
    with pytest.raises(InputError, match="rank 0's bad row"):
        halve(4)  # this rank succeeded, rank 0 did not: it stops too, with rank 0's paragraph
    monkeypatch.setattr(torchrun, "_current", Simulated(2, 3, (None, None, None)))
    with pytest.raises(DistributedError, match=r"rank 2 of 3 failed: ZeroDivisionError: zero"):
        halve(0)  # a fault (not bad input) is named with its rank
    assert halve(8) == 4.0  # nobody failed


def test_shards_cover_every_item_once_and_on_main() -> None:
    shares = shard_by_tokens([5, 1, 9, 3, 3], 2)
    assert sorted(i for s in shares for i in s) == list(range(5))
    assert Dist(0, 1).on_main(lambda: "written") == "written"
    assert Simulated(1, 2, (None, None)).on_main(lambda: "written") is None
