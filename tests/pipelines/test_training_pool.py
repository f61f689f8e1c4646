"""`run_trainings`: runs in worker processes give exactly the numbers of runs in-process."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from otb_diag.io.scenarios import default_checkpoint
from otb_diag.pipelines.figures.training_pool import TrainingJob, run_trainings
from otb_diag.pipelines.rl_training import scenario_settings

# slow: trainings in worker processes
pytestmark = pytest.mark.slow


def _metrics(path: Path) -> list[dict]:
    lines = [json.loads(line) for line in (path / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in m.items() if k != "wall_time"} for m in lines]


def test_workers_reproduce_in_process_runs(tmp_path: Path) -> None:
    def jobs(root: Path) -> list[TrainingJob]:
        return [
            TrainingJob(
                default_checkpoint(),
                root / baseline,
                scenario_settings(
                    "default",
                    baseline=baseline,
                    steps=2,
                    group_size=2,
                    prompts_per_step=2,
                    save_every=0,
                    lr=1e-3,
                    seed=5,
                ),  # fmt: skip
                baseline,
            )
            for baseline in ("mean", "otb")
        ]

    serial = run_trainings(jobs(tmp_path / "serial"), workers=1, progress=False)
    parallel = run_trainings(jobs(tmp_path / "parallel"), workers=2, progress=False)
    assert [s.settings.baseline for s in parallel] == ["mean", "otb"]
    for baseline in ("mean", "otb"):
        a, b = _metrics(tmp_path / "serial" / baseline), _metrics(tmp_path / "parallel" / baseline)
        assert a == b
        assert len(a) == 2 and a[0]["tokens_sampled"] > 0
    assert serial[0].totals.tokens_sampled == parallel[0].totals.tokens_sampled
