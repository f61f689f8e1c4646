"""The result of `otb-diag train`: train.json's content as fields, and the text it prints."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from otb_diag.pipelines.results import schema
from otb_diag.pipelines.train_settings import TrainSettings


@dataclass(frozen=True)
class TrainTotals:
    steps: int
    tokens_sampled: int
    wall_time: float  # seconds


@dataclass(frozen=True)
class TrainResult(schema.Versioned):
    """What `otb-diag train` did (`to_json()` is its train.json). `early` and `late`: the means
    of each logged metric (mean reward, grad norm, entropy, response length) over the first and
    the last `window` steps."""

    command: ClassVar[str] = "train"

    checkpoint: str  # the checkpoint training started from
    settings: TrainSettings
    window: int
    early: dict[str, float]
    late: dict[str, float]
    totals: TrainTotals
    versions: dict[str, str]
    out: str

    def format(self) -> str:
        """The short human summary `otb-diag train` prints: early and late steps side by side."""
        k, n = self.window, self.totals.steps

        def row(name: str, key: str, fmt: str) -> str:
            return f"{name:<13}{self.early[key]:{fmt}} -> {self.late[key]:{fmt}}"

        return "\n".join(
            [
                f"trained      {n} steps from {self.checkpoint}",
                f"means of     steps 1-{k} -> steps {n - k + 1}-{n}",
                row("mean reward", "mean_reward", ".3f"),
                row("grad norm", "grad_norm", ".3g"),
                row("entropy", "entropy", ".3f"),
                row("length", "mean_response_length", ".1f"),
                f"sampled      {self.totals.tokens_sampled} tokens in "
                f"{self.totals.wall_time:.1f} s",
                f"wrote        {self.out} (metrics.jsonl, rollouts/, checkpoint-*/, train.json)",
            ]
        )
