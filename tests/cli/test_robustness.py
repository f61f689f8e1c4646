"""Never a traceback (issue 12): real trainers' logs with zeros, single points, NaN, resumed
runs and no variance proxy; and property-based fuzzing of training logs and rollout rows, which
must end in exit 0 or exit 2 with an `otb-diag: error:` paragraph, never another exception.
Example counts are kept small: every example runs the CLI (and dynamics draws its figures)."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from otb_diag.cli.main import app
from typer.testing import CliRunner

from otb_diag.dynamics.collapse import DetectionRule, analyse_run
from otb_diag.io.training_logs import read_training_log
from otb_diag.pipelines.inspect.recipe import FIELDS
from otb_diag.pipelines.training_logs.recipe import default_names
from otb_diag.plots.dynamics import fig1_grad_norm_and_score

runner = CliRunner()
FUZZ = settings(
    max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


def trl_state(path: Path, steps: range, surge_at: int = 120, zero_every: int = 7) -> Path:
    """A TRL trainer_state.json: grad_norm surges 20x at `surge_at`, and is logged as 0.0 on
    every `zero_every`-th step (TRL 1.16 does that when every group had equal rewards)."""
    rng = np.random.default_rng(0)
    history = []
    for s in steps:
        g = float(np.exp(rng.normal(0, 0.1))) * (20 if s >= surge_at else 1)
        history.append(
            {
                "step": s,
                "grad_norm": 0.0 if s % zero_every == 0 else g,
                "rewards/accuracy/mean": 0.5,
                "rewards/format/mean": 0.25,
                "num_tokens": 100.0 * s,
                "loss": 0.0,
            }
        )
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"log_history": history, "global_step": steps[-1]}))
    return path


def verl_csv_without_proxies(path: Path) -> Path:
    rng = np.random.default_rng(1)
    steps = np.arange(1, 201)
    grad = np.exp(rng.normal(0, 0.1, steps.size)) * np.where(steps >= 120, 20.0, 1.0)
    frame = {"training/global_step": steps, "actor/grad_norm": grad, "critic/score/mean": 0.5}
    path.parent.mkdir(parents=True, exist_ok=True)
    pd.DataFrame(frame).to_csv(path, index=False)
    return path


@pytest.mark.slow  # fuzzes a whole command with hypothesis (seconds)
@pytest.mark.renders  # reads the rendered figures
def test_trl_and_verl_logs_without_proxies_give_figures_not_a_traceback(tmp_path: Path) -> None:
    """Measured failure 1: the collapse was found, then matplotlib raised 'Data cannot be
    log-scaled' drawing figure 2 (no variance proxy; zero grad norms)."""
    state = trl_state(
        tmp_path / "grpo-run" / "checkpoint-200" / "trainer_state.json", range(1, 201)
    )
    csv = verl_csv_without_proxies(tmp_path / "verl-run" / "metrics.csv")
    out = tmp_path / "out"
    result = runner.invoke(
        app, ["dynamics", "--log", str(state), "--log", str(csv), "--out", str(out), "--json"]
    )
    assert result.exit_code == 0, result.output
    runs = json.loads(result.stdout)["runs"]
    assert [(r["run"], r["collapse_step"]) for r in runs] == [("grpo-run", 120), ("verl-run", 120)]
    assert [r["variance_proxy_kind"] for r in runs] == ["none", "none"]
    for name in ("fig1_grad_norm_and_score", "fig2_variance_and_grad_norm", "score_vs_tokens"):
        assert (out / f"{name}.png").stat().st_size > 0


def test_zero_grad_norms_sit_on_the_floor_and_runs_are_named_by_directory(tmp_path: Path) -> None:
    """Measured failure 2: zeros fell off the log axis as vertical lines; the run was labelled
    'checkpoint-12'."""
    state = trl_state(tmp_path / "my-run" / "checkpoint-12" / "trainer_state.json", range(1, 41))
    assert default_names([state]) == ["my-run"]
    frame = read_training_log(state).frame
    result = analyse_run(frame, DetectionRule())
    table = frame.assign(run="my-run")
    fig = fig1_grad_norm_and_score(table, [SimpleNamespace(run="my-run", **result.summary())])
    top = fig.axes[0]
    zeros = frame["step"][frame["grad_norm"] == 0].to_numpy()
    (line, *_) = [ln for ln in top.get_lines() if ln.get_label() == "my-run"]
    y = np.asarray(line.get_ydata(), dtype=float)
    assert np.isnan(y[frame["grad_norm"].to_numpy() == 0]).all()  # no line down to 0
    (floor,) = [ln for ln in top.get_lines() if ln.get_marker() == "v"]
    assert list(floor.get_xdata()) == list(zeros)
    floor_y = np.asarray(floor.get_ydata(), dtype=float)
    positive = frame["grad_norm"][frame["grad_norm"] > 0]
    assert (floor_y == positive.min() / 3).all() and top.get_ylim()[0] < floor_y[0]
    assert any("5 zero or negative" in t.get_text() for t in top.texts)


def test_resumed_run_keeps_the_latest_of_each_step(tmp_path: Path) -> None:
    """A run resumed from its step-100 checkpoint logs steps 100-150 again; the abandoned pass
    had counted 30,000 tokens by step 150, the resumed one restarts from the checkpoint's
    20,000: not an error once the latest row of each step is kept."""
    first = [
        {"step": s, "grad_norm": 1.0, "reward": 0.1, "num_tokens": 200.0 * s} for s in range(1, 151)
    ]
    second = [
        {"step": s, "grad_norm": 2.0, "reward": 0.9, "num_tokens": 20_000.0 + 100.0 * (s - 100)}
        for s in range(100, 201)
    ]
    path = tmp_path / "run" / "trainer_state.json"
    path.parent.mkdir()
    path.write_text(json.dumps({"log_history": first + second}))
    frame = read_training_log(path).frame
    assert frame["step"].tolist() == list(range(1, 201))
    assert (frame.set_index("step").loc[100:, "score"] == 0.9).all()
    assert (frame.set_index("step").loc[:99, "score"] == 0.1).all()


# ------------------------------------------------------------------------ fuzzing


_number = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([0.0, -1.0, 1e300, -1e-300]),
    st.integers(-(10**12), 10**12),
)
_junk = st.one_of(
    st.none(), st.text(max_size=5), st.booleans(), st.lists(st.integers(), max_size=2)
)


@st.composite
def training_log(draw: st.DrawFn) -> list[dict]:
    """Rows of our metrics.jsonl: any step order (duplicates, decreasing), any numbers (NaN,
    inf, zero, negative, huge), keys sometimes missing or of the wrong type."""
    rows = []
    for _ in range(draw(st.integers(1, 40))):
        row = {}
        for key in ("step", "grad_norm", "mean_reward", "proxy2_total_power", "tokens_sampled"):
            choice = draw(st.integers(0, 9))
            if key == "step" and choice < 8:
                row[key] = draw(st.integers(0, 60))
            elif choice < 7:
                row[key] = draw(_number)
            elif choice < 9:
                row[key] = draw(_junk)
        rows.append(row)
    return rows


def assert_clean_exit(result) -> None:
    """Exit 0, or exit 2 with one `otb-diag: error:` paragraph: never another exception."""
    assert result.exit_code in (0, 2), (result.exit_code, result.output, result.exception)
    if result.exit_code == 2:
        assert result.stderr.splitlines()[-1].startswith("otb-diag: error: ")


@pytest.mark.slow  # fuzzes a whole command with hypothesis (seconds)
@FUZZ
@given(rows=training_log())
def test_fuzzed_training_logs_never_raise(tmp_path: Path, rows: list[dict]) -> None:
    path = tmp_path / "run" / "metrics.jsonl"
    path.parent.mkdir(exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    result = runner.invoke(app, ["dynamics", "--log", str(path), "--out", str(tmp_path / "o")])
    assert_clean_exit(result)


_value = st.one_of(
    _number,
    _junk,
    st.text(st.characters(codec="utf-8"), max_size=6),
    st.lists(_number, max_size=4),
    st.lists(st.integers(-3, 40), max_size=4),
    st.dictionaries(st.text(max_size=2), st.integers(), max_size=2),
)
_FIELDS = (
    *FIELDS,  # every canonical field, plus other spellings, trainer keys and an unknown one
    *("group", "uid", "temperature", "trainer_advantage", "input", "output", "score"),
    *("completion", "extra_ünïcode"),
)


@st.composite
def rollout_rows(draw: st.DrawFn) -> list[dict]:
    """Rows mixing well-formed values and wrong types, missing and extra fields, huge,
    negative and NaN numbers, unicode and empty lists."""
    rows = []
    for _ in range(draw(st.integers(1, 5))):
        n = draw(st.integers(0, 3))
        good = {
            "group": draw(st.sampled_from(["a", "b", "ß"])),
            "prompt_ids": [1, 2],
            "response_ids": list(range(3, 3 + n)),
            "reward": draw(st.floats(-2, 2)),
            "logprobs": [-0.5] * n,
            "sum_pi2": [0.5] * n,
        }
        for key in draw(st.lists(st.sampled_from(_FIELDS), max_size=4)):
            good[key] = draw(_value)
        for key in draw(st.lists(st.sampled_from(list(good)), max_size=2)):
            good.pop(key, None)
        rows.append(good)
    return rows


@pytest.mark.slow  # fuzzes a whole command with hypothesis (seconds)
@FUZZ
@given(rows=rollout_rows())
def test_fuzzed_rollout_rows_never_raise(tmp_path: Path, rows: list[dict]) -> None:
    path = tmp_path / "rollouts.jsonl"
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), "utf-8")
    assert_clean_exit(runner.invoke(app, ["rollouts", "inspect", str(path), "--json"]))
    out = tmp_path / "energy"
    assert_clean_exit(
        runner.invoke(
            app, ["energy", "--model-free", "--rollouts", str(path), "--out", str(out), "--quiet"]
        )
    )
