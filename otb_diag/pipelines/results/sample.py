"""The result of `otb-diag rollouts sample`: manifest.json's content as fields, and the lines it
prints."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from otb_diag.pipelines.results import schema
from otb_diag.pipelines.results.schema import Distributed

# The files a sampling run leaves in its output folder.
ROLLOUTS = "rollouts.jsonl"
MANIFEST = "manifest.json"


@dataclass(frozen=True)
class SampleResult(schema.Versioned):
    """What `otb-diag rollouts sample` drew and wrote (`to_json()` is its manifest.json)."""

    command: ClassVar[str] = "rollouts sample"

    checkpoint: str
    prompts: str  # the prompts file, absolute
    prompts_sha256: str | None  # None for a datasets directory
    prompts_count: int
    responses: int
    # SampleSettings.identity() (what a --resume must share) and `from_policy`: flat, JSON scalars
    settings: dict[str, str | int | float | bool | None]
    batches: int
    truncated: int  # responses cut at max_new_tokens
    mean_reward: float
    generated_tokens: int
    seconds: float
    sampled_tokens_this_run: int  # less than generated_tokens after --resume
    distributed: Distributed  # the tokens each process generated in this run
    versions: dict[str, str]

    def format(self, out: Path) -> str:
        """What was sampled, how fast, and where it went (`out`: the output folder)."""
        return (
            f"sampled {self.responses} responses to {self.prompts_count} prompts "
            f"({self.generated_tokens} tokens, {self.truncated} truncated) in "
            f"{self.seconds:.1f} s; mean reward {self.mean_reward:.3f}\n"
            f"wrote {out / ROLLOUTS} and {out / MANIFEST}"
        )
