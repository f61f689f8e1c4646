"""The few numbers per row that `rollouts inspect` summarizes, gathered while the file streams past.

`RowFacts.add` keeps, for each response, its group (as a position), outcome reward, token count
and masked-token count, and folds temperatures, steps and field presence into small sets and
counters: memory grows by a few numbers per row, never by its tokens. `RowFacts.summary` turns
them into the command's result (`otb_diag/pipelines/results/inspect.py:InspectResult`).
"""

from __future__ import annotations

from array import array
from collections import Counter
from pathlib import Path

import numpy as np

from otb_diag.io.rollouts.readers import Rollouts
from otb_diag.io.rollouts.rows import Response
from otb_diag.io.rollouts.stream import group_names
from otb_diag.pipelines.results.inspect import (
    GroupMeans,
    GroupSizes,
    InspectResult,
    MaskedTokens,
    RewardStats,
    TokenLengths,
    UniformGroups,
)

# Fields whose presence is counted (temperature is always set: it defaults to 1.0).
FIELDS = (
    "prompt",
    "response",
    "prompt_ids",
    "response_ids",
    "reward",
    "token_rewards",
    "mask",
    "step",
    "logprobs",
    "sum_pi2",
    "is_weights",
)
MAX_HISTOGRAM_VALUES = 10


def _outcome_reward(r: Response) -> float:
    """The response's total reward: `reward`, else the sum of its `token_rewards`."""
    return r.reward if r.reward is not None else float(sum(r.token_rewards or ()))


class RowFacts:
    """Per-row facts of a rollout file, in file order (see the module docstring)."""

    def __init__(self) -> None:
        # (file position, group id) -> group position, in order of first appearance
        self.group_position: dict[tuple[int, str], int] = {}
        self.row_group = array("q")  # [rows]
        self.reward = array("d")  # [rows] outcome reward
        self.tokens = array("q")  # [rows] response tokens; -1 for a row without ids
        self.masked = array("q")  # [rows] response tokens with mask 0
        self.temperatures: set[float] = set()
        self.steps: set[int] = set()
        self.fields: Counter[str] = Counter({name: 0 for name in FIELDS})

    def add(self, r: Response, file: int = 0) -> None:
        """One more row, of the file at position `file` of the set."""
        key = (file, r.group)
        self.row_group.append(self.group_position.setdefault(key, len(self.group_position)))
        self.reward.append(_outcome_reward(r))
        self.tokens.append(-1 if r.response_ids is None else len(r.response_ids))
        self.masked.append(r.mask.count(0) if r.mask is not None else 0)
        self.temperatures.add(r.temperature)
        if r.step is not None:
            self.steps.add(r.step)
        self.fields.update(name for name in FIELDS if getattr(r, name) is not None)

    def summary(self, shell: Rollouts, round_trip_issues: list[str] | None = None) -> InspectResult:
        """Rows, groups, lengths, rewards, masking, temperatures, steps, clamped logged values
        and fields of the rows added from `shell` (its path, format, files and clamped counts),
        with the `round_trip_issues` found while tokenizing them.

        Token statistics (`response_tokens`, `masked_tokens`) need every response's ids and are
        None otherwise. `uniform_groups` counts groups of two or more responses whose rewards are
        all equal: under a group baseline their advantages are all zero, so they cost compute and
        carry no signal. Groups of one are listed in `singleton_groups`.
        """
        names = group_names(list(self.group_position), shell.files or [Path(shell.path)])
        row_group = np.frombuffer(self.row_group, dtype=np.int64)
        rewards = np.frombuffer(self.reward, dtype=np.float64)
        tokens = np.frombuffer(self.tokens, dtype=np.int64)
        sizes = np.bincount(row_group, minlength=len(names))  # [groups]
        order = np.argsort(row_group, kind="stable")  # rows grouped, file order within
        starts = np.concatenate(([0], np.cumsum(sizes)[:-1]))
        by_group = rewards[order]
        group_mean = np.add.reduceat(by_group, starts) / sizes  # [groups]
        group_min = np.minimum.reduceat(by_group, starts)
        group_max = np.maximum.reduceat(by_group, starts)
        size_counts = Counter(sizes.tolist())
        has_ids = bool((tokens >= 0).all())
        return InspectResult(
            path=str(shell.path),
            rollouts_format=shell.format,
            files=len(shell.files) or 1,
            rows=len(rewards),
            groups=len(names),
            group_size=GroupSizes(
                **_spread(sizes, ("min", "median", "max")),
                counts={str(s): size_counts[s] for s in sorted(size_counts)},
            ),
            singleton_groups=[g for g, n in zip(names, sizes, strict=True) if n == 1],
            response_tokens=_length_stats(tokens) if has_ids else None,
            reward=_reward_stats(rewards),
            group_mean_reward=GroupMeans(**_spread(group_mean, ("min", "median", "mean", "max"))),
            uniform_groups=_uniform_groups(sizes, group_min, group_max),
            masked_tokens=_masked_tokens(tokens, self.masked) if has_ids else None,
            temperatures=sorted(self.temperatures),
            steps=sorted(self.steps),
            clamped_round_off=dict(shell.clamped),
            fields_present={name: self.fields[name] for name in FIELDS},
            round_trip_issues=list(round_trip_issues or []),
        )


def _spread(values: np.ndarray, stats: tuple[str, ...]) -> dict[str, float]:
    """The named statistics of `values`, as plain floats."""
    a = np.asarray(values, dtype=float)
    funcs = {"min": np.min, "median": np.median, "mean": np.mean, "max": np.max}
    return {name: float(funcs[name](a)) for name in stats}


def _length_stats(tokens: np.ndarray) -> TokenLengths:
    lengths = tokens.astype(float)
    nonempty = lengths[lengths > 0]
    p10, median, p90 = np.percentile(lengths, [10, 50, 90])
    return TokenLengths(
        total=float(lengths.sum()),
        min=float(lengths.min()),
        p10=float(p10),
        median=float(median),
        p90=float(p90),
        max=float(lengths.max()),
        mean=float(lengths.mean()),
        # Over the responses with a token: an empty one (an aborted generation, kept on
        # reading) would make it infinite; NaN when every response is empty.
        max_over_min=float(lengths.max() / nonempty.min()) if len(nonempty) else float("nan"),
    )


def _reward_stats(a: np.ndarray) -> RewardStats:
    binary = bool(np.isin(a, (0.0, 1.0)).all())
    values, counts = np.unique(a, return_counts=True)
    return RewardStats(
        mean=float(a.mean()),
        std=float(a.std()),
        min=float(a.min()),
        max=float(a.max()),
        binary=binary,
        share_one=float((a == 1.0).mean()) if binary else None,
        share_zero=float((a == 0.0).mean()) if binary else None,
        histogram=(
            {_key(v): int(n) for v, n in zip(values.tolist(), counts, strict=True)}
            if len(values) <= MAX_HISTOGRAM_VALUES
            else None
        ),
    )


def _uniform_groups(sizes: np.ndarray, low: np.ndarray, high: np.ndarray) -> UniformGroups:
    """Groups of two or more whose rewards are all equal (min = max), and the reward they share.

    sizes, low, high: `[groups]` responses, smallest and largest reward of each group."""
    multi = sizes >= 2
    uniform = Counter(low[multi & (low == high)].tolist())
    count = sum(uniform.values())
    of = int(multi.sum())
    return UniformGroups(
        count=count,
        of=of,
        share=count / of if of else None,
        by_value={_key(v): uniform[v] for v in sorted(uniform)},
    )


def _masked_tokens(tokens: np.ndarray, masked: array) -> MaskedTokens:
    """Tokens with mask 0 (tool output) among all response tokens; a missing mask is all ones."""
    total = int(tokens.sum())
    count = int(np.frombuffer(masked, dtype=np.int64).sum())
    return MaskedTokens(count=count, of=total, share=count / total if total else 0.0)


def _key(value: float) -> str:
    """A reward value as a JSON object key: 1.0 -> "1", 0.5 -> "0.5"."""
    return f"{value:g}"
