"""`runtime/sharded.py` without launching ranks: in a world of one every item is this process's
and `run` merges its one part; with other ranks (their collectives scripted) every rank splits
rank 0's lists, measures its own items, and only rank 0 merges. The torchrun tests
(`tests/runtime/test_torchrun.py`) run the commands built on it over 2 gloo ranks."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from otb_diag.errors import InputError
from otb_diag.io.load_options import LoadOptions
from otb_diag.runtime import torchrun
from otb_diag.runtime.sharded import shard
from otb_diag.runtime.torchrun import Dist, shard_by_tokens

PAIRS = [("g0", 5), ("g1", 1), ("g2", 9), ("g3", 3), ("g4", 3)]


@dataclass(frozen=True)
class Scripted(Dist):
    """Rank `rank` of a world whose other ranks send, collective after collective, the objects
    of `sent` (one dict rank → object per collective, in order; missing ranks send None)."""

    sent: list = field(default_factory=list)

    def all_gather(self, obj):
        others = self.sent.pop(0)
        return [obj if r == self.rank else others.get(r) for r in range(self.world_size)]

    def gather(self, obj):
        gathered = self.all_gather(obj)
        return gathered if self.is_main else None


def test_a_world_of_one_measures_everything_and_merges_one_part() -> None:
    shards = shard(PAIRS, [("b0", 2)], what="the pool")
    assert shards.ranks == 1 and shards.sizes == [23]
    assert shards.plan == [[["g0", "g1", "g2", "g3", "g4"]], [["b0"]]]
    assert shards.every_round_mine() == [["g0", "g1", "g2", "g3", "g4"], ["b0"]]
    merged = shards.run(lambda items: [i.upper() for i in items], lambda parts: parts)
    assert merged == [(["g0", "g1", "g2", "g3", "g4"], ["G0", "G1", "G2", "G3", "G4"])]


def test_rank_0_merges_every_ranks_part_in_rank_order(monkeypatch) -> None:
    split = shard_by_tokens([s for _, s in PAIRS], 2)
    theirs = [PAIRS[i][0] for i in split[1]]
    # the plan's broadcast, the measure's agreement, the gather, the merge's agreement
    d = Scripted(0, 2, [{}, {}, {1: len(theirs)}, {}])
    monkeypatch.setattr(torchrun, "_current", d)
    shards = shard(PAIRS)
    assert shards.plan == [[[PAIRS[i][0] for i in s] for s in split]]
    assert shards.sizes == [sum(PAIRS[i][1] for i in s) for s in split]
    merged = shards.run(len, lambda parts: parts)
    assert merged == [(shards.plan[0][0], len(shards.plan[0][0])), (theirs, len(theirs))]


def test_other_ranks_split_rank_0s_lists_and_return_none(monkeypatch) -> None:
    seen_by_rank_0 = [PAIRS[:2]]  # rank 1 sees more items (a part written since): rank 0's win
    measured = []
    d = Scripted(1, 2, [{0: seen_by_rank_0}, {}, {}, {}])
    monkeypatch.setattr(torchrun, "_current", d)
    shards = shard(PAIRS)
    assert shards.plan == [[["g0"], ["g1"]]]
    assert shards.run(measured.extend, lambda parts: "merged") is None
    assert measured == ["g1"]  # its own item, measured; the merge is rank 0's


def test_rank_0s_merge_error_stops_the_other_ranks(monkeypatch) -> None:
    bad = InputError("rank 0 could not merge", field="x")
    d = Scripted(1, 2, [{0: [PAIRS]}, {}, {}, {0: ("input", bad)}])
    monkeypatch.setattr(torchrun, "_current", d)
    with pytest.raises(InputError, match="rank 0 could not merge"):
        shard(PAIRS).run(len, lambda parts: parts)


def test_fewer_things_than_ranks_is_bad_input(monkeypatch) -> None:
    monkeypatch.setattr(torchrun, "_current", Scripted(0, 3, [{}]))
    with pytest.raises(InputError, match="3 ranks but only 2 group"):
        shard(PAIRS[:2], what="rollouts.jsonl")


def test_a_device_map_is_refused_under_torchrun_at_the_settings_check() -> None:
    """Every command that loads a model refuses --device-map with several ranks (energy,
    variance-compare, rollouts sample: `pipelines/shell.py:run_recipe` checks it first),
    without loading anything."""
    pytest.importorskip("accelerate")
    mapped = LoadOptions(device_map="cpu")
    mapped.check(1)  # one process may spread a model
    with pytest.raises(InputError, match="--device-map spreads one model") as err:
        mapped.check(2)
    assert err.value.field == "device-map"
    LoadOptions().check(2)  # one whole model per rank
