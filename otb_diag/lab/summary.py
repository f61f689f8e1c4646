"""What `otb-diag lab build` returns and prints: the lab.json manifest of a built lab, and it in
a few lines."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class BuiltLab:
    """A lab `lab build` wrote into `out`: `to_json()` is its lab.json, `format()` the text."""

    manifest: dict[str, Any]
    out: Path

    def to_json(self) -> dict[str, Any]:
        return self.manifest

    def format(self) -> str:
        return format_lab(self.manifest, self.out)


def format_lab(manifest: dict[str, Any], out: Path) -> str:
    """The short text `lab build` prints: parameters, checkpoints, rollouts, time."""
    steps = ", ".join(str(c["step"]) for c in manifest["checkpoints"])
    lines = [
        f"built a {manifest['n_params']:,}-parameter lab in {out} (seed {manifest['seed']})",
        f"checkpoints  steps {steps}",
    ]
    for key in ("rollouts", "rollouts_tir"):
        if key in manifest:
            lines.append(f"{key:<12} {_group_line(manifest[key])}")
    took = manifest["timings"].get("total_s", 0)
    lines.append(f"took         {took:.0f} s; lab.json holds it all")
    return "\n".join(lines)


def _group_line(stats: dict[str, Any]) -> str:
    tokens = stats["response_tokens"]
    return (
        f"{stats['rows']} rows in {stats['groups']} groups ({stats['mixed_groups']} with mixed "
        f"rewards), mean reward {stats['mean_reward']:.3f}, responses of {tokens['min']}-"
        f"{tokens['max']} tokens"
    )
