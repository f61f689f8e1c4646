"""`otb-diag dynamics` pools the split a trainer logged (`pipelines/pooled_budget.py`) as the live
`attach` pools it: a log written by the live pools (non-finite values left out, as TRL's
`attach` leaves them out) gives the same `otb/budget/...` back from `dynamics` to 1e-6, the
figure of the pooled noise scale and budget.csv are written, and the result leads with the
knee or its honest bound."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from small_runs import dynamics, report

from otb_diag.errors import InputError
from otb_diag.io.training_logs import read_training_log
from otb_diag.maths.noise.budget_stream import ONE_STEP_NOISE_SCALE, BudgetPools
from otb_diag.maths.noise.pooling import unit_share
from otb_diag.pipelines.pooled_budget import budget_long, pooled_over_steps, split_identity
from otb_diag.pipelines.results.dynamics import DynamicsResult


def logged_steps(steps: int, split_every: int, grad_sq: float, seed: int = 0) -> list[dict]:
    """A trainer's log entries: every step its reward and gradient norm, every `split_every`-th
    the split of grpo (within, between, total, |G|²) and of `params` (total, |G|² only), and the
    live pools' `otb/budget/...` as `attach` logs them (finite values only)."""
    rng = np.random.default_rng(seed)
    live = BudgetPools("otb/")
    entries = []
    for step in range(1, steps + 1):
        entry = {"step": step, "grad_norm": float(np.exp(rng.normal())), "reward": 0.5}
        if (step - 1) % split_every == 0:
            within, between = 3 + rng.normal(0, 0.3), 1 + rng.normal(0, 0.5)
            g = grad_sq + rng.normal(0, 0.4)
            split = {
                "otb/split/grpo/within": within,
                "otb/split/grpo/between": between,
                "otb/split/grpo/total": within + between,
                "otb/split/grpo/grad_sq": g,
                "otb/split/params/total": 7 * (within + between),
                "otb/split/params/grad_sq": 7 * g + rng.normal(0, 0.5),
                "otb/split/prompts": 8.0,
                "otb/split/group_size": 4.0,
                "otb/split/mean_response_tokens": 20 + rng.normal(),
            }
            split |= live.update(split, step)
            entry |= {k: v for k, v in split.items() if math.isfinite(v)}
        entries.append(entry)
    return entries


def trainer_state(path: Path, entries: list[dict]) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    (path / "trainer_state.json").write_text(json.dumps({"log_history": entries}))
    return path / "trainer_state.json"


@pytest.mark.slow  # runs a command end to end (a real run: seconds)
@pytest.mark.renders  # reads the rendered figures
def test_dynamics_gives_the_live_pooled_numbers_back(tmp_path: Path) -> None:
    entries = logged_steps(60, 2, 0.5)
    state = trainer_state(tmp_path / "run", entries)
    result = dynamics([state], tmp_path / "out")
    (run,) = result.runs
    last = [e for e in entries if "otb/split/grpo/total" in e][-1]
    assert run.budget is not None and [b.estimator for b in run.budget] == ["grpo", "params"]
    for pooled in run.budget:
        assert pooled.step == last["step"] == 59
        for pool in ("window", "ema"):
            for field, value in getattr(pooled, pool).items():
                key = f"otb/budget/{pooled.estimator}/{pool}/{field}"
                if key in last:
                    assert value == pytest.approx(last[key], rel=1e-6), key
                else:  # left out of the log as not finite
                    assert value is None or not math.isfinite(value), key
    assert (tmp_path / "out" / "pooled_noise_scale.png").stat().st_size > 0
    table = pd.read_csv(tmp_path / "out" / "budget.csv")
    assert len(table) == 30 * 2 * 2  # split steps × estimators × pools
    back = DynamicsResult.from_json(
        json.loads((tmp_path / "out" / "collapse.json").read_text()), tmp_path / "collapse.json"
    )
    assert back.runs[0].budget[0].sentence == run.budget[0].sentence
    assert run.budget[0].sentence in result.format()


@pytest.mark.slow  # runs a command end to end (a real run: seconds)
def test_a_resolved_knee_and_an_honest_bound(tmp_path: Path) -> None:
    """A strong signal over 60 split steps is resolved: the sentence names the knee and its
    interval; a zero-mean signal is not: the sentence says so with its steps and prompts."""
    strong_log = trainer_state(tmp_path / "strong", logged_steps(60, 1, 0.5))
    strong = dynamics([strong_log], tmp_path / "o1", ["strong"]).runs[0].budget[0]
    assert strong.window["resolved"] == 1.0
    assert strong.sentence.startswith("at step 60, the knee is ~")
    assert "under grpo at N = 4" in strong.sentence
    assert strong.sentence.endswith("you train with 8 prompts a step")
    assert strong.window["noise_scale_low"] < strong.window["noise_scale"]
    none_log = trainer_state(tmp_path / "none", logged_steps(60, 1, 0.0, seed=1))
    none = dynamics([none_log], tmp_path / "o2", ["none"]).runs[0].budget[0]
    assert none.window["resolved"] == 0.0
    assert "|G|² is not resolved after 60 steps (480 prompts)" in none.sentence


@pytest.mark.slow  # runs a command end to end (a real run: seconds)
def test_pooling_skips_steps_without_the_split_and_a_log_without_it_has_none(
    tmp_path: Path,
) -> None:
    entries = logged_steps(9, 3, 0.5)
    log = trainer_state(tmp_path / "a", entries)
    table, pools = pooled_over_steps(read_training_log(log).frame, "otb/", log)
    assert table["step"].tolist() == [1, 4, 7] and pools.last_step == 7
    long = budget_long(table, "otb/", "a")
    assert set(long["estimator"]) == {"grpo", "params"} and set(long["pool"]) == {"window", "ema"}
    plain = [{k: v for k, v in e.items() if not k.startswith("otb/")} for e in entries]
    result = dynamics([trainer_state(tmp_path / "b", plain)], tmp_path / "out")
    assert result.runs[0].budget is None
    assert not (tmp_path / "out" / "budget.csv").exists()


# The docs/live.md run: a real TRL GRPOTrainer on SmolLM2-135M-Instruct (CPU), 40 steps of 8
# prompts × 4, `attach(split_every=1)`; its trainer_state.json trimmed to the reward, the split
# and the live window pools (117 kB).
SMOLLM2_RUN = Path(__file__).parent / "smollm2_trl_state.json"


@pytest.mark.slow  # runs a command end to end (a real run: seconds)
def test_dynamics_on_the_real_run_gives_its_live_pools_back(tmp_path: Path) -> None:
    """Every split step's window pool, pooled again from the log, equals what `attach` logged
    live (exactly: the same floats, the same order; the within share as `unit_share` clips it
    since, the log written before: 1.023 at step 1); the answer is docs/live.md's: OTB's |G|²
    resolved from step 24 on, the knee ~53.5 prompts [31.3, 184] at step 40 against P = 8, and
    grpo's not resolved (at least 45.6 prompts)."""
    state = json.loads(SMOLLM2_RUN.read_text())
    result = dynamics([SMOLLM2_RUN], tmp_path, ["smollm2"])
    table = pd.read_csv(tmp_path / "budget.csv")
    logged = {e["step"]: e for e in state["log_history"]}
    window = table[table["pool"] == "window"]
    compared = 0
    for row in window.to_dict("records"):
        entry = logged[row["step"]]
        for field, value in row.items():
            key = f"otb/budget/{row['estimator']}/window/{field}"
            if key in entry:
                live = entry[key]
                if field.startswith("within_share"):
                    (live,) = unit_share(live)
                assert value == pytest.approx(live, rel=1e-6), (row["step"], key)
                compared += 1
    assert compared > 1500
    otb = window[window["estimator"] == "otb"].set_index("step")
    assert otb.index[otb["resolved"] == 1].tolist() == list(range(24, 41))
    grpo, pooled = result.runs[0].budget
    assert (result.runs[0].baseline, result.runs[0].group_size) == ("grpo", 4)  # its sentences'
    assert pooled.sentence == (
        "at step 40, the knee is ~53.5 prompts [31.3, 184] under otb at N = 4 (3.17 k tokens "
        "a step); you train with 8 prompts a step"
    )
    assert "the knee is at least 45.6 prompts" in grpo.sentence and not grpo.window["resolved"]


def test_a_log_from_before_the_rename_reads_under_today_s_names() -> None:
    """The real run's log, written when one step's noise scale was `otb/split/<b>/noise_scale`,
    reads with it under today's name, every value as logged; the pooled knee keeps its name."""
    state = json.loads(SMOLLM2_RUN.read_text())
    old = "otb/split/otb/noise_scale"
    logged = {e["step"]: e[old] for e in state["log_history"] if old in e}
    frame = read_training_log(SMOLLM2_RUN).frame.set_index("step")
    assert len(logged) > 20 and old not in frame
    assert frame[f"otb/split/otb/{ONE_STEP_NOISE_SCALE}"].dropna().to_dict() == logged
    assert frame["otb/budget/otb/window/noise_scale"].notna().any()


@pytest.mark.slow  # runs a command end to end (a real run: seconds)
def test_the_report_leads_with_the_pooled_answer(tmp_path: Path) -> None:
    """`report` on the real run's dynamics directory: its first verdicts are the pooled
    sentences, one per estimator, before the collapse verdict."""
    dynamics([SMOLLM2_RUN], tmp_path / "dyn", ["smollm2"])
    result = report([tmp_path / "dyn"], tmp_path / "report.html")
    first, second, third = result.verdicts[:3]
    assert first.topic == second.topic == "prompts per step over training (dyn: smollm2)"
    assert first.sentence.startswith("At step 40, under grpo at N = 4, |G|² is not resolved")
    assert second.sentence.startswith("At step 40, the knee is ~53.5 prompts [31.3, 184]")
    assert third.topic.startswith("collapse")
    assert "the knee is ~53.5 prompts" in (tmp_path / "report.html").read_text(encoding="utf-8")


def test_an_estimator_name_may_hold_any_character() -> None:
    """A name is read from its keys' known ends, so a "/" in it (a hub path) pools and comes
    back whole in the long table."""
    odd = "org/base:v2 ä"
    entries = [
        {k.replace("/grpo/", f"/{odd}/"): v for k, v in e.items()} for e in logged_steps(6, 1, 0.5)
    ]
    frame = pd.DataFrame(entries).sort_values("step")
    table, pools = pooled_over_steps(frame, "otb/", Path("log.jsonl"))
    assert list(pools.latest) == [odd, "params"]
    long = budget_long(table, "otb/", "a")
    assert set(long["estimator"]) == {odd, "params"} and set(long["pool"]) == {"window", "ema"}
    assert long["noise_scale"].notna().all()


@pytest.mark.parametrize(
    ("key", "value"),
    [("otb/split/grpo/total", -20.0), ("otb/split/prompts", 0.0), ("otb/split/group_size", 1.0)],
)
def test_an_impossible_value_is_refused_not_pooled_into_a_knee(
    tmp_path: Path, key: str, value: float
) -> None:
    """A negative tr Σ gave "the knee is ~-20 prompts", P = 0 a knee too: now the file, the
    step and the key are named, and nothing is pooled."""
    entries = logged_steps(9, 1, 0.5)
    entries[4][key] = value
    path = trainer_state(tmp_path, entries)
    with pytest.raises(InputError) as caught:
        pooled_over_steps(read_training_log(path).frame, "otb/", path)
    said = str(caught.value)
    assert said.startswith(f"{path}, field '{key}': at step 5, {value:g} is impossible")


def test_a_split_that_cannot_be_pooled_says_why_once(tmp_path: Path) -> None:
    """No step shape, or a term that is not a number: each reason said once, with its first
    step and how many more share it; the rest of the split still pools."""
    entries = logged_steps(6, 1, 0.5)
    for entry in entries[:2]:
        del entry["otb/split/prompts"]
    for entry in entries[3:]:
        entry["otb/split/params/grad_sq"] = "n/a"
    path = trainer_state(tmp_path, entries)
    notes: list[str] = []
    table, pools = pooled_over_steps(read_training_log(path).frame, "otb/", path, notes.append)
    assert notes == [
        f"{path}: not pooled at step 1 and 1 more: the split is logged without the step's shape "
        "(otb/split/prompts absent).",
        f"{path}: not pooled at step 4 and 2 more: otb/split/params/grad_sq absent or not a "
        "number.",
    ]
    assert table["step"].tolist() == [3, 4, 5, 6]
    assert pools.latest["params"]["window"].steps == 1 and pools.latest["grpo"]["window"].steps == 4


def test_the_split_names_the_runs_baseline_and_group_size() -> None:
    """A TRL log records neither: the split is logged under the trainer's own estimator beside
    OTB and all parameters, at the run's N; under OTB alone, or at varying N, neither is known."""
    frame = pd.DataFrame(logged_steps(4, 1, 0.5))
    assert split_identity(frame, "otb/") == ("grpo", 4)
    otb = frame.rename(columns=lambda c: c.replace("/grpo/", "/otb/"))
    assert split_identity(otb, "otb/") == (None, 4)
    varied = frame.assign(**{"otb/split/group_size": [4.0, 4.0, 8.0, 4.0]})
    assert split_identity(varied, "otb/") == ("grpo", None)
    assert split_identity(frame.filter(["step", "grad_norm"]), "otb/") == (None, None)


@pytest.mark.slow  # runs a command end to end (a real run: seconds)
def test_the_table_and_the_figure_name_the_runs_baseline_and_n(tmp_path: Path) -> None:
    """A TRL log (neither named; the split logged under grpo at N = 4) given no label: the row
    says grpo at N = 4, and so do dynamics.csv and score against tokens' legend ("grpo, N=?"
    before)."""
    from otb_diag.plots.dynamics import fig_score_vs_tokens

    entries = [{**e, "num_tokens": 100.0 * e["step"]} for e in logged_steps(6, 1, 0.5)]
    result = dynamics([trainer_state(tmp_path / "run", entries)], tmp_path / "out")
    (run,) = result.runs
    assert (run.baseline, run.group_size) == ("grpo", 4)
    table = pd.read_csv(tmp_path / "out" / "dynamics.csv")
    assert (table["baseline"] == "grpo").all() and (table["group_size"] == 4).all()
    ax = fig_score_vs_tokens(table, result.runs, None).axes[0]
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["grpo, N=4"]


@pytest.mark.slow  # runs a command end to end (a real run: seconds)
def test_the_live_values_of_a_family_are_one_steps(tmp_path: Path) -> None:
    """The pooled window's noise scale and its interval's ends come from the last step that
    logged the window (its high end, infinite, left out of the log there: None, not an older
    step's finite one); the per-step energy from the last step; each with its step, in
    collapse.json and in the report's table."""
    entries = logged_steps(6, 2, 0.5)  # the split at steps 1, 3, 5
    for entry in entries:
        entry["otb/energy/sequence_mean"] = float(entry["step"])
    high = "otb/budget/grpo/window/noise_scale_high"
    entries[2][high] = 123.0  # step 3 logged a finite one
    entries[4].pop(high, None)  # step 5: infinite, left out
    result = dynamics([trainer_state(tmp_path / "run", entries)], tmp_path / "dyn", ["r"])
    (run,) = result.runs
    window = "otb/budget/grpo/window/noise_scale"
    assert run.otb is not None and run.otb[window] == entries[4][window]
    assert run.otb[high] is None  # not step 3's 123
    assert run.otb_steps is not None and run.otb_steps[window] == run.otb_steps[high] == 5
    assert run.otb["otb/energy/sequence_mean"] == 6.0 and run.otb_steps["otb/split/prompts"] == 5
    page = report([tmp_path / "dyn"], tmp_path / "report.html")
    text = (tmp_path / "report.html").read_text(encoding="utf-8")
    assert page is not None and "the metrics sharing all but the last part" in text
