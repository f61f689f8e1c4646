"""What `otb-diag rollouts inspect` reports: the first things to check in a rollout file.

`summarize` turns `Rollouts` into a JSON-serialisable dict; `format_summary` renders that dict
for the terminal. Both are pure: no I/O.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import numpy as np

from otb_diag.io.rollouts import Response, Rollouts

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


def outcome_reward(r: Response) -> float:
    """The response's total reward: `reward`, else the sum of its `token_rewards`."""
    return r.reward if r.reward is not None else float(sum(r.token_rewards or ()))


def summarize(rollouts: Rollouts) -> dict[str, Any]:
    """Rows, groups, lengths, rewards, masking, temperatures, steps and fields of `rollouts`.

    Token statistics (`response_tokens`, `masked_tokens`) need every response's ids and are None
    otherwise: call after `tokenize_rollouts`. `uniform_groups` counts groups of two or more
    responses whose rewards are all equal: under a group baseline their advantages are all zero,
    so they cost compute and carry no signal. Groups of one are listed in `singleton_groups`.
    """
    responses = rollouts.responses
    groups = rollouts.groups()
    rewards = [outcome_reward(r) for r in responses]
    group_rewards = {g: [rewards[i] for i in idx] for g, idx in groups.items()}
    sizes = [len(idx) for idx in groups.values()]
    size_counts = Counter(sizes)
    return {
        "path": str(rollouts.path),
        "format": rollouts.format,
        "files": len(rollouts.files) or 1,
        "rows": len(responses),
        "groups": len(groups),
        "group_size": {
            **_spread(sizes, ("min", "median", "max")),
            "counts": {str(s): size_counts[s] for s in sorted(size_counts)},
        },
        "singleton_groups": [g for g, idx in groups.items() if len(idx) == 1],
        "response_tokens": _length_stats(responses),
        "reward": _reward_stats(rewards),
        "group_mean_reward": _spread(
            [float(np.mean(v)) for v in group_rewards.values()], ("min", "median", "mean", "max")
        ),
        "uniform_groups": _uniform_groups(group_rewards),
        "masked_tokens": _masked_tokens(responses),
        "temperatures": sorted({r.temperature for r in responses}),
        "steps": sorted({r.step for r in responses if r.step is not None}),
        "clamped_round_off": dict(rollouts.clamped),
        "fields_present": {
            name: sum(getattr(r, name) is not None for r in responses) for name in FIELDS
        },
    }


def _spread(values: list[float], stats: tuple[str, ...]) -> dict[str, float]:
    """The named statistics of `values`, as plain floats."""
    a = np.asarray(values, dtype=float)
    funcs = {"min": np.min, "median": np.median, "mean": np.mean, "max": np.max}
    return {name: float(funcs[name](a)) for name in stats}


def _length_stats(responses: list[Response]) -> dict[str, float] | None:
    if any(r.response_ids is None for r in responses):
        return None
    lengths = np.array([len(r.response_ids or ()) for r in responses], dtype=float)
    p10, median, p90 = np.percentile(lengths, [10, 50, 90])
    return {
        "total": float(lengths.sum()),
        "min": float(lengths.min()),
        "p10": float(p10),
        "median": float(median),
        "p90": float(p90),
        "max": float(lengths.max()),
        "mean": float(lengths.mean()),
        # Empty responses are rejected on reading, so min >= 1.
        "max_over_min": float(lengths.max() / lengths.min()),
    }


def _reward_stats(rewards: list[float]) -> dict[str, Any]:
    a = np.asarray(rewards, dtype=float)
    binary = bool(np.isin(a, (0.0, 1.0)).all())
    counts = Counter(rewards)
    return {
        "mean": float(a.mean()),
        "std": float(a.std()),
        "min": float(a.min()),
        "max": float(a.max()),
        "binary": binary,
        "share_one": float((a == 1.0).mean()) if binary else None,
        "share_zero": float((a == 0.0).mean()) if binary else None,
        "histogram": (
            {_key(v): counts[v] for v in sorted(counts)}
            if len(counts) <= MAX_HISTOGRAM_VALUES
            else None
        ),
    }


def _uniform_groups(group_rewards: dict[str, list[float]]) -> dict[str, Any]:
    """Groups of two or more whose rewards are all equal, and the reward they share."""
    multi = [v for v in group_rewards.values() if len(v) >= 2]
    uniform = Counter(v[0] for v in multi if len(set(v)) == 1)
    count = sum(uniform.values())
    return {
        "count": count,
        "of": len(multi),
        "share": count / len(multi) if multi else None,
        "by_value": {_key(v): uniform[v] for v in sorted(uniform)},
    }


def _masked_tokens(responses: list[Response]) -> dict[str, Any] | None:
    """Tokens with mask 0 (tool output) among all response tokens; a missing mask is all ones."""
    if any(r.response_ids is None for r in responses):
        return None
    total = sum(len(r.response_ids or ()) for r in responses)
    masked = sum((r.mask or []).count(0) for r in responses)
    return {"count": masked, "of": total, "share": masked / total}


def _key(value: float) -> str:
    """A reward value as a JSON object key: 1.0 -> "1", 0.5 -> "0.5"."""
    return f"{value:g}"


def format_summary(summary: dict[str, Any]) -> str:
    """A compact, aligned block of text for the terminal."""
    s = summary
    sizes = s["group_size"]
    reward = s["reward"]
    uniform = s["uniform_groups"]
    lines = [
        ("rollouts", f"{s['path']} ({s['format']})"),
        ("rows", str(s["rows"])),
        (
            "groups",
            f"{s['groups']}; size min {_n(sizes['min'])}, median {_n(sizes['median'])}, "
            f"max {_n(sizes['max'])} ("
            + ", ".join(f"{n} of size {size}" for size, n in sizes["counts"].items())
            + ")",
        ),
        ("groups of one", _ids(s["singleton_groups"])),
    ]
    tokens = s["response_tokens"]
    lines.append(
        (
            "response tokens",
            "unknown (no token ids: give a checkpoint to tokenize the text)"
            if tokens is None
            else ", ".join(
                f"{name} {_n(tokens[name])}"
                for name in ("min", "p10", "median", "p90", "max", "mean")
            )
            + f"; max/min {_n(tokens['max_over_min'])}",
        )
    )
    reward_line = ", ".join(f"{k} {_n(reward[k])}" for k in ("mean", "std", "min", "max"))
    if reward["binary"]:
        reward_line += f"; binary: {_pct(reward['share_one'])} are 1"
    lines.append(("reward", reward_line))
    if reward["histogram"] is not None:
        lines.append(
            ("reward values", ", ".join(f"{v}: {n}" for v, n in reward["histogram"].items()))
        )
    lines.append(
        (
            "pass rate / group" if reward["binary"] else "mean reward / group",
            ", ".join(f"{k} {_n(v)}" for k, v in s["group_mean_reward"].items()),
        )
    )
    lines.append(
        (
            "all-equal groups",
            "no groups of two or more"
            if uniform["share"] is None
            else f"{uniform['count']} of {uniform['of']} ({_pct(uniform['share'])})"
            + "".join(f"; reward {v}: {n}" for v, n in uniform["by_value"].items())
            + (" (no signal under a group baseline)" if uniform["count"] else ""),
        )
    )
    masked = s["masked_tokens"]
    lines.append(
        (
            "masked tokens",
            "unknown (no token ids)"
            if masked is None
            else f"{masked['count']} of {masked['of']} ({_pct(masked['share'])})",
        )
    )
    lines.append(("temperatures", ", ".join(_n(t) for t in s["temperatures"])))
    steps = s["steps"]
    lines.append(
        ("steps", f"{len(steps)} ({steps[0]} to {steps[-1]})" if steps else "none recorded")
    )
    rows = s["rows"]
    lines.append(
        (
            "fields present",
            ", ".join(
                name if n == rows else f"{name} ({n}/{rows})"
                for name, n in s["fields_present"].items()
                if n
            ),
        )
    )
    width = max(len(label) for label, _ in lines)
    return "\n".join(f"{label:<{width}}  {value}" for label, value in lines)


def _n(x: float) -> str:
    """A number without trailing noise: 4.0 -> "4", 0.123456 -> "0.1235"."""
    return f"{x:.4g}"


def _pct(share: float) -> str:
    return f"{100 * share:.1f}%"


def _ids(ids: list[str], shown: int = 5) -> str:
    if not ids:
        return "none"
    more = f", ... (+{len(ids) - shown} more)" if len(ids) > shown else ""
    return f"{len(ids)}: " + ", ".join(ids[:shown]) + more
