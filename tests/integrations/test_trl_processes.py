"""`attach` on a real GRPOTrainer and RLOOTrainer in 2 gloo processes (torchrun, CPU, the
embedded checkpoint; tests/integrations/trl_torchrun.py): 2 completions a process and
micro-step, 3 micro-steps a step, so each step's 12 rows are 3 groups of 4 whose second group
straddles the two processes (rows 4-5 on process 0, 6-7 on process 1). The dump holds each
process's rows once, in process order; every logged `otb/` number equals the one-process
computation on the dumped rows (`step_metrics`, and `split_metrics` on scores from the step's
checkpoint) to 1e-6; `otb-diag energy --model-free` on the dump reproduces them as it does for
one process; and TRL's own logged mean reward is the dump's. A failure on one process stops
both together, the training going on."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from launch import torchrun
from test_trl_live import check_reproduces, energy, step_checkpoint
from trl_toy import GENERATIONS

from otb_diag.integrations.core.step_metrics import (
    SPLIT_MODE,
    split_baselines,
    split_metrics,
    step_metrics,
)
from otb_diag.integrations.trl.support import LOSS_AGGREGATION, SUPPORTED
from otb_diag.io.loading import load_rollouts
from otb_diag.io.rollouts.to_batch import make_batch
from otb_diag.maths.estimators.registry import trainer_baseline
from otb_diag.maths.noise.budget_stream import BudgetPools
from otb_diag.maths.noise.step_split import SPLIT_SEED
from otb_diag.policy.scores.token_scores import token_scores

pytestmark = [pytest.mark.torchrun, pytest.mark.external]  # torchrun, TRL
SCRIPT = Path(__file__).with_name("trl_torchrun.py")
PROCESSES, PER_STEP, ACCUMULATION, STEPS = 2, 2, 3, 2
ROWS = PROCESSES * PER_STEP * ACCUMULATION  # a step's generation batch
SPLIT_K = 16  # trl_torchrun.SPLIT_K
TRAINERS = ("GRPOTrainer", "RLOOTrainer")
# The estimator each run's settings make (GRPOConfig's defaults; RLOO's beta = 0, no normalising)
AUDITED = {"GRPOTrainer": trainer_baseline("trl"), "RLOOTrainer": trainer_baseline("trl-rloo")}
# What the logged entry holds beside the step's metrics: the collapse watch and the split's
# pools (over steps), the all-parameter estimate of DDP's all-reduce, and where Σπ² came from.
NOT_STEP_METRICS = (
    "otb/collapse/",
    "otb/budget/",
    "otb/split/params/",
    "otb/sum_pi2_from_loss_logits",
)


@pytest.fixture(scope="module")
def trainings(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Both trainers' runs, one after the other in one launch (each process starts once)."""
    out = tmp_path_factory.mktemp("two-processes")
    result = torchrun(PROCESSES, out, PER_STEP, ACCUMULATION, STEPS, *TRAINERS, script=SCRIPT)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "switched off" not in result.stderr, result.stderr[-3000:]
    return out


@pytest.fixture(scope="module", params=TRAINERS)
def run(request: pytest.FixtureRequest, trainings: Path) -> Path:
    """The run's folder, named for the trainer (`SUPPORTED`'s key) it ran."""
    return trainings / request.param


def logged(out: Path) -> list[dict[str, float]]:
    entries = json.loads((out / "log_history.json").read_text())
    return [e for e in entries if "grad_norm" in e]


def dumped(out: Path, step: int) -> list[dict]:
    text = (out / "otb" / f"step_{step:06d}.jsonl").read_text()
    return [json.loads(line) for line in text.splitlines()]


def generated(out: Path, rank: int, step: int) -> list[list[int]]:
    """The responses process `rank` generated at `step`: its completion ids up to the last
    token of its completion mask (as trl_torchrun.py recorded them)."""
    rows = json.loads((out / f"rank{rank}-step{step}.json").read_text())
    responses = []
    for ids, mask in zip(rows["completion_ids"], rows["completion_mask"], strict=True):
        last = max((t for t, m in enumerate(mask) if m), default=len(ids) - 1)
        responses.append(ids[: last + 1])
    return responses


def test_the_dump_holds_every_processs_rows_once(run: Path) -> None:
    assert sorted(p.name for p in (run / "otb").iterdir()) == [
        f"step_{s:06d}.jsonl" for s in range(1, STEPS + 1)
    ]
    for entry in logged(run):
        step = entry["step"]
        rows = dumped(run, step)
        each = [generated(run, rank, step) for rank in range(PROCESSES)]
        assert [len(e) for e in each] == [ROWS // PROCESSES] * PROCESSES
        assert [r["response_ids"] for r in rows] == [ids for e in each for ids in e]
        groups = [r["group"] for r in rows]
        assert groups == [f"s{step}-g{i // GENERATIONS}" for i in range(ROWS)]
        for i, r in enumerate(rows):  # a group's rows share a prompt, also across processes
            assert r["prompt_ids"] == rows[i - i % GENERATIONS]["prompt_ids"]
        # TRL's own mean over every process's rewards
        mean = sum(r["reward"] for r in rows) / ROWS
        assert entry["reward"] == pytest.approx(mean, rel=1e-6)


def test_every_logged_number_is_the_one_process_computation(run: Path) -> None:
    """The audit agrees on every step (the straddling group's advantages were computed by TRL
    over both processes' rewards, and recomputed here over the gathered rows)."""
    from transformers import AutoModelForCausalLM

    supported = SUPPORTED[run.name]
    audited = AUDITED[run.name]
    aggregation = supported.aggregation or LOSS_AGGREGATION["dapo"]  # GRPOConfig's default
    entries = logged(run)
    assert [e["step"] for e in entries] == list(range(1, STEPS + 1))
    for entry in entries:
        step = entry["step"]
        batch = make_batch(load_rollouts(run / "otb" / f"step_{step:06d}.jsonl"))
        expected = step_metrics(batch, audited)
        model = AutoModelForCausalLM.from_pretrained(step_checkpoint(run, step))
        scores = token_scores(model, batch, SPLIT_MODE, SPLIT_K, SPLIT_SEED).proj
        split = split_metrics(batch, scores, split_baselines(audited), aggregation)
        assert entry["otb/audit/agrees"] == 1.0 and entry["otb/sum_pi2_from_loss_logits"] == 1.0
        names = {k for k in entry if k.startswith("otb/") and not k.startswith(NOT_STEP_METRICS)}
        finite = {k for k, v in (expected | split).items() if math.isfinite(v)}
        assert names == finite
        for name in finite & set(expected):  # the same rows, the same functions
            assert entry[name] == pytest.approx(expected[name], rel=1e-6), name
        for name in finite & set(split):  # scores of 6 rows a process against 12 at once
            assert entry[name] == pytest.approx(split[name], rel=1e-6, abs=1e-12), name


def test_the_pools_are_those_of_the_logged_split(run: Path) -> None:
    """The main process pools the split it logged (the head-mode baselines' and, under DDP,
    all parameters'): `BudgetPools` fed the logged steps gives the logged `otb/budget/...`."""
    pools = BudgetPools("otb/")
    for entry in logged(run):
        split = {k: v for k, v in entry.items() if k.startswith("otb/split/")}
        assert "otb/split/params/grad_sq" in split  # torchrun runs the trainer under DDP
        pooled = pools.update(split, entry["step"])
        got = {k: v for k, v in entry.items() if k.startswith("otb/budget/")}
        audited = AUDITED[run.name]
        assert {k.split("/")[2] for k in got} == set(split_baselines(audited)) | {"params"}
        assert got.keys() == {k for k, v in pooled.items() if math.isfinite(v)}
        for name, value in got.items():
            assert value == pytest.approx(pooled[name], rel=1e-9), name


def test_model_free_energy_on_the_dump_reproduces_the_logged_step(
    run: Path, tmp_path: Path
) -> None:
    for entry in logged(run):
        step = entry["step"]
        rollouts = run / "otb" / f"step_{step:06d}.jsonl"
        summary = energy(rollouts, tmp_path / str(step), "--model-free")
        assert summary["totals"]["responses"] == ROWS
        check_reproduces(summary, entry, rel=1e-6)


def test_an_error_on_one_process_stops_both_and_the_training_goes_on(tmp_path: Path) -> None:
    """Reading its rows fails on process 1 only, at step 1: it says so once, hands the error
    over at that step's gather, and both processes stop there together (neither waits for the
    other at a later gather); the training runs its steps to the end."""
    args = (PER_STEP, ACCUMULATION, STEPS, "fail", "GRPOTrainer")
    result = torchrun(PROCESSES, tmp_path, *args, script=SCRIPT)
    out = tmp_path / "GRPOTrainer"
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stderr.count("otb-diag live diagnostics switched off") == 1
    assert "switched off at step 1 (process 1): RuntimeError: planted on process 1" in (
        result.stderr
    )
    entries = json.loads((out / "log_history.json").read_text())
    assert [e["step"] for e in entries if "grad_norm" in e] == list(range(1, STEPS + 1))
    # The all-parameter estimate is DDP's all-reduce's, not the step's diagnostics: it goes on.
    assert not any(k.startswith("otb/") and "/params/" not in k for e in entries for k in e)
    assert not list((out / "otb").glob("*.jsonl"))


def test_an_error_on_one_process_before_its_micro_steps_stops_both_at_the_gather(
    tmp_path: Path,
) -> None:
    """Forming its rewards fails on process 1 only as step 2's batch is generated
    (`LiveDiagnostics._start`, before any micro-step trains on it): its micro-steps still come
    to that step's gather and hand the error over, and both processes stop there together
    instead of process 0 waiting at the gather for a process that never comes. Step 1 is
    measured as ever, nothing of the step's diagnostics is logged from step 2 on, and the
    training runs its steps to the end. The launch's timeout is a fraction of the default: a
    process left waiting fails the test within minutes, not at the process group's timeout."""
    args = (PER_STEP, ACCUMULATION, STEPS, "fail-start-2", "GRPOTrainer")
    result = torchrun(PROCESSES, tmp_path, *args, script=SCRIPT, timeout=90)
    out = tmp_path / "GRPOTrainer"
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stderr.count("otb-diag live diagnostics switched off") == 1
    warning = "switched off at step 2 (process 1): RuntimeError: planted on process 1 at step 2"
    assert warning in result.stderr, result.stderr[-3000:]
    entries = [e for e in json.loads((out / "log_history.json").read_text()) if "grad_norm" in e]
    assert [e["step"] for e in entries] == list(range(1, STEPS + 1))
    # The all-parameter estimate is DDP's all-reduce's, not the step's diagnostics: it goes on.
    measured = [{k for k in e if k.startswith("otb/") and "/params/" not in k} for e in entries]
    assert measured[0] and not any(measured[1:])
    assert [p.name for p in (out / "otb").glob("*.jsonl")] == ["step_000001.jsonl"]
