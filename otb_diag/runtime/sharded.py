"""The one way a command's work is split over the ranks of a torchrun job and put back together:
`shard` splits items by size over the ranks of the running `session()`, `Shards.run` measures
each rank's share and merges the shares on rank 0. A recipe calls these and never asks which
rank it is: what rank 0 alone holds comes back from `run`, None on the other ranks.

In a world of one (no torchrun) every item is this process's, and `run` is
`merge([(items, measure(items))])`."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

from otb_diag.runtime.torchrun import current, require_groups, shard_by_tokens

Item = TypeVar("Item")  # an item: a group's position in the pool, a batch's number
T = TypeVar("T")
R = TypeVar("R")

# A rank's items and what it measured of them, as `merge` receives them (rank order).
Part = tuple[list[Item], T]


@dataclass(frozen=True)
class Shards(Generic[Item]):
    """Items split over the ranks, in rounds: `plan[r][k]` is rank k's items of round r (a
    round: a chunk of the pool, the batches of a phase), in the order they were given;
    `sizes[k]` is rank k's total size over every round (the result's record of the split)."""

    plan: list[list[list[Item]]]
    sizes: list[int]

    @property
    def ranks(self) -> int:
        """How many ranks share the work (1 without torchrun)."""
        return len(self.sizes)

    def mine(self, r: int = 0) -> list[Item]:
        """This rank's items of round `r`."""
        return self.plan[r][current().rank]

    def every_round_mine(self) -> list[list[Item]]:
        """This rank's items of each round, in round order (what a single pass reads)."""
        return [self.mine(r) for r in range(len(self.plan))]

    def run(
        self,
        measure: Callable[[list[Item]], T],
        merge: Callable[[list[Part[Item, T]]], R],
        r: int = 0,
    ) -> R | None:
        """`measure(items)` of this rank's items of round `r` on every rank (one phase: any
        rank's error stops every rank with it), gathered on rank 0 with each rank's items, in
        rank order, and `merge`d there (one phase too). Returns the merge on rank 0, None on
        the other ranks. Every rank must call it, in the same order: it is a collective."""
        d = current()
        part = d.checked(lambda: measure(self.mine(r)))
        parts = d.gather(part)
        if parts is None:
            d.checked(lambda: None)  # wait for rank 0's merge, and raise its error
            return None
        return d.checked(lambda: merge(list(zip(self.plan[r], parts, strict=True))))


def shard(*rounds: Sequence[tuple[Item, int]], what: str | None = None) -> Shards[Item]:
    """Each round's (item, size) pairs split over the ranks of the running session by size
    (`shard_by_tokens`: largest first to the lightest rank; each rank's items keep the order
    given). The plan is rank 0's: every rank splits rank 0's lists, so every rank holds the same
    plan even where the ranks see their input differently (parts on a shared disk). With
    `what`, the items of every round together name that many distinct things (groups) and each
    rank must get at least one: fewer than the ranks is an `InputError` naming `what`."""
    d = current()
    given = [list(pairs) for pairs in rounds]
    if d.world_size > 1:
        given = d.all_gather(given if d.is_main else None)[0]
    if what is not None:
        require_groups(sum(len(pairs) for pairs in given), d, what)
    plan = []
    sizes = [0] * d.world_size
    for pairs in given:
        split = shard_by_tokens([size for _, size in pairs], d.world_size)
        plan.append([[pairs[i][0] for i in share] for share in split])
        for k, share in enumerate(split):
            sizes[k] += sum(pairs[i][1] for i in share)
    return Shards(plan, sizes)
