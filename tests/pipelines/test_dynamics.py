"""Training-log readers, collapse detection and `otb-diag dynamics` (theory.md §5)."""

import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from otb_diag.cli.main import app
from small_runs import dynamics
from typer.testing import CliRunner

from otb_diag.dynamics.collapse import DetectionRule, analyse_run, smoothed_score, target_row
from otb_diag.errors import InputError
from otb_diag.io.training_logs import COLUMNS, parse_label, read_training_log

runner = CliRunner()


def synthetic_run(
    n: int = 200,
    collapse_at: int | None = 150,
    rise_at: int | None = 130,
    step_every: int = 2,
    seed: int = 0,
) -> pd.DataFrame:
    """A tidy run: log-normal noise (sd 0.1) around a flat gradient norm and variance proxy; the
    norm jumps 20x from point `collapse_at`, the proxy 3x from point `rise_at`."""
    rng = np.random.default_rng(seed)
    points = np.arange(n)
    grad = np.exp(rng.normal(0.0, 0.1, n))
    proxy = 0.5 * np.exp(rng.normal(0.0, 0.1, n))
    if collapse_at is not None:
        grad[points >= collapse_at] *= 20.0
    if rise_at is not None:
        proxy[points >= rise_at] *= 3.0
    score = np.clip(0.01 * points, 0.0, 1.0)
    return pd.DataFrame(
        {
            "step": points * step_every,
            "grad_norm": grad,
            "score": score,
            "response_length": 100.0,
            "variance_proxy": proxy,
            "variance_proxy_kind": "proxy2",
            "tokens_sampled": 1000.0 * (points + 1),
            "updates": np.maximum(points * step_every - 1, 0),
            "baseline": "otb",
            "group_size": 4.0,
        }
    )


# ---------------------------------------------------------------- collapse detection


def test_planted_surge_is_found_with_its_lead_time() -> None:
    result = analyse_run(synthetic_run(), DetectionRule())
    assert result.collapse_step == 300  # point 150, logged every 2 steps
    assert result.warning_step == 260  # point 130
    assert result.lead_steps == 40
    assert result.collapse_z > 6


def test_variance_rise_after_the_collapse_is_no_warning() -> None:
    result = analyse_run(synthetic_run(rise_at=170), DetectionRule())
    assert result.collapse_step == 300
    assert result.warning_step is None and result.lead_steps is None


def test_variance_rise_beyond_the_horizon_is_no_warning() -> None:
    result = analyse_run(synthetic_run(rise_at=60), DetectionRule(lead_horizon=50))
    assert result.collapse_step == 300
    assert result.warning_step is None


def test_no_lead_time_without_a_variance_proxy() -> None:
    run = synthetic_run().assign(variance_proxy=np.nan, variance_proxy_kind="none")
    result = analyse_run(run, DetectionRule())
    assert (result.collapse_step, result.variance_proxy_kind) == (300, "none")
    assert result.warning_step is None and result.lead_steps is None


@settings(max_examples=40, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    sigma=st.floats(0.005, 0.5),
    level=st.floats(-5.0, 5.0),
)
def test_no_collapse_in_a_flat_noisy_log(seed: int, sigma: float, level: float) -> None:
    """Log-normal noise of any size around any level, with isolated single-point spikes (10x,
    never two in a row), raises no alarm at the default threshold."""
    rng = np.random.default_rng(seed)
    n = 300
    grad = np.exp(level + rng.normal(0.0, sigma, n))
    spikes = 2 * rng.choice(n // 2, size=8, replace=False)  # even points: never adjacent
    grad[spikes] *= 10.0
    run = synthetic_run(n=n, collapse_at=None, rise_at=None).assign(grad_norm=grad)
    result = analyse_run(run, DetectionRule())
    assert result.collapse_step is None
    assert result.lead_steps is None


def test_the_target_row_hand_case() -> None:
    score = np.array([0.0, 0.2, 0.4, 0.6, 0.8, 1.0])
    tokens = np.array([10.0, 20.0, 30.0, 40.0, 50.0, 60.0])
    smoothed = smoothed_score(score, 2)  # nan, .1, .3, .5, .7, .9
    assert np.isnan(smoothed[0])
    assert target_row(tokens, smoothed, 0.5) == 3
    assert target_row(tokens, smoothed, 0.95) is None
    assert target_row(tokens, smoothed_score(score, 1), 0.6) == 3
    # A row without a score is skipped by the smoothing, not averaged as zero.
    gap = smoothed_score(np.array([0.4, np.nan, 0.6, 0.6]), 2)
    assert np.isnan(gap[1]) and gap[2] == pytest.approx(0.5)
    assert target_row(tokens[:4], gap, 0.55) == 3
    # A row without a token count is passed over: tokens and updates are of one row.
    assert target_row(np.array([10.0, 20.0, np.nan, 40.0, 50.0, 60.0]), smoothed, 0.5) == 3
    assert target_row(np.array([10.0, 20.0, 30.0, np.nan, 50.0, 60.0]), smoothed, 0.5) == 4


def test_tokens_and_updates_to_target_in_analyse_run() -> None:
    result = analyse_run(synthetic_run(collapse_at=None), DetectionRule(smooth=1), target=0.5)
    assert result.tokens_to_target == 51_000.0  # score 0.01 * point reaches 0.5 at point 50
    assert result.updates_to_target == 2 * 50 - 1  # its step less one: steps count from 1


def test_updates_to_target_are_the_tables_at_the_targets_row() -> None:
    run = synthetic_run(collapse_at=None)  # steps 0, 2, 4, …: the score reaches 0.5 at row 50
    run["updates"] = np.arange(len(run)) // 4  # four generation batches an update
    result = analyse_run(run, DetectionRule(smooth=1), target=0.5)
    assert (result.tokens_to_target, result.updates_to_target) == (51_000.0, 50 // 4)


def test_updates_are_the_controllers_count_where_it_logged_one(tmp_path: Path) -> None:
    """Step − 1 for a run updating every step; the knee controller's count, carried forward
    over rows that lack it (a log written every other step), where it ran."""
    rows = [{"step": s, "grad_norm": 1.0, "mean_reward": 0.5} for s in (1, 2, 3, 4)]
    plain = tmp_path / "plain" / "metrics.jsonl"
    plain.parent.mkdir()
    plain.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert read_training_log(plain).frame["updates"].tolist() == [0, 1, 2, 3]
    counts = {2: 1.0, 4: 1.0}  # the controller logs before the step's update
    gated = tmp_path / "gated" / "metrics.jsonl"
    gated.parent.mkdir()
    gated.write_text("".join(
        json.dumps({**r, **({"otb/controller/updates": counts[r["step"]]} if r["step"] in counts
                            else {})}) + "\n" for r in rows[::-1]
    ))  # fmt: skip
    assert read_training_log(gated).frame["updates"].tolist() == [0, 1, 1, 1]


# SmolLM2 under the knee controller (bench/results/smollm2-train/runs/grpo-n-4-controller-s2,
# rounded): per TRL step the logged grad_norm and the controller's updates before the step's
# batch. Between an update's closing batches TRL logged the partial sum's norm, flat over the
# batches without a signal.
GATED_NORMS = [1.296, 1.991, 0.0, 0.835, 0.978, *[0.1797] * 8, 0.3922, 0.3922, 0.3922, 0.4470,
               0.5357, 0.6916, 0.6916, 0.6916, 0.2628, 0.3459, 0.3459, 0.3459, 0.3875, 0.4669,
               0.4669, 0.4669, 0.0]  # fmt: skip
GATED_UPDATES = [0, 1, 2, 3, 3, *[4] * 8, *[5] * 8, *[6] * 8, 7]


def test_a_controller_runs_norms_are_read_where_its_updates_closed(tmp_path: Path) -> None:
    """Read as every step's norm, the partial sums' flat stretches fired the collapse rule at
    step 14 of a healthy run; kept where an update closed (the next row counts one more, and
    the last row), they are the updates' own norms and nothing fires."""
    rows = [
        {"step": s + 1, "grad_norm": g, "mean_reward": 0.1, "otb/controller/updates": u}
        for s, (g, u) in enumerate(zip(GATED_NORMS, GATED_UPDATES, strict=True))
    ]
    gated = read_training_log(write_jsonl(tmp_path / "metrics.jsonl", rows)).frame
    closed = [1, 2, 3, 5, 13, 21, 29, 30]
    kept = gated["grad_norm"].to_numpy()
    np.testing.assert_array_equal(np.flatnonzero(np.isfinite(kept)) + 1, closed)
    assert kept[np.isfinite(kept)].tolist() == [GATED_NORMS[s - 1] for s in closed]
    assert analyse_run(gated, DetectionRule()).collapse_step is None
    as_every_step = gated.assign(grad_norm=GATED_NORMS)
    assert analyse_run(as_every_step, DetectionRule()).collapse_step == 14


# ---------------------------------------------------------------- log readers


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_reads_our_metrics_jsonl(tmp_path: Path) -> None:
    rows = [
        {
            "step": s,
            "mean_reward": 0.1 * s,
            "pass_rate": 0.1 * s,
            "grad_norm": 1.0 + s,
            "proxy1_signal_strength": 0.1,
            "proxy2_total_power": 2.0 + s,
            "proxy3_pure_noise": 0.5,
            "mean_response_length": 12.0,
            "tokens_sampled": 500 * s,
            "wall_time": 1.0,
            "baseline": "otb",
            "group_size": 4,
        }
        for s in (1, 2, 3)
    ]
    log = read_training_log(write_jsonl(tmp_path / "metrics.jsonl", rows))
    assert log.source == "otb-diag"
    assert list(log.frame.columns) == list(COLUMNS)
    assert log.frame["step"].tolist() == [1, 2, 3]
    assert log.frame["score"].tolist() == pytest.approx([0.1, 0.2, 0.3])
    assert log.frame["variance_proxy"].tolist() == [3.0, 4.0, 5.0]
    assert set(log.frame["variance_proxy_kind"]) == {"proxy2"}
    assert log.frame["tokens_sampled"].tolist() == [500, 1000, 1500]
    assert set(log.frame["baseline"]) == {"otb"} and set(log.frame["group_size"]) == {4.0}


def test_reads_verl_jsonl_file_logger_rows(tmp_path: Path) -> None:
    """verl's file logger nests the metrics under `data`; tokens are per step, so summed; a
    step logged twice (resumed run) keeps its last row."""
    rows = [
        {
            "step": s,
            "data": {
                "training/global_step": s,
                "actor/grad_norm": 0.5,
                "critic/score/mean": score,
                "response_length/mean": 200.0,
                "variance_proxy/proxy2_total_power": 1.5,
                "perf/total_num_tokens": 1000,
            },
        }
        for s, score in ((1, 0.1), (2, 0.2), (2, 0.25), (3, 0.3))
    ]
    log = read_training_log(write_jsonl(tmp_path / "verl.jsonl", rows))
    assert log.source == "verl"
    assert log.frame["step"].tolist() == [1, 2, 3]
    assert log.frame["score"].tolist() == [0.1, 0.25, 0.3]
    assert log.frame["tokens_sampled"].tolist() == [1000.0, 3000.0, 4000.0]
    assert log.frame["response_length"].tolist() == [200.0] * 3
    assert log.frame["baseline"].isna().all()


@pytest.mark.slow  # runs a command end to end (a real run: seconds)
def test_verl_proxy3_beside_the_gradient_norm_is_said_to_mix_units(tmp_path: Path) -> None:
    """proxy3 = (proxy2 − grad_norm²)/(N − 1) subtracts a parameter-space norm from a
    logit-space energy: the run's summary and the printed text say so; proxy2 alone does not."""
    rows = [
        {
            "training/global_step": s,
            "actor/grad_norm": 0.5,
            "critic/score/mean": 0.1,
            "variance_proxy/proxy2_total_power": 1.5,
            "variance_proxy/proxy3_pure_noise": 0.2,
        }
        for s in range(1, 6)
    ]
    mixed = write_jsonl(tmp_path / "mixed.jsonl", rows)
    clean = write_jsonl(
        tmp_path / "clean.jsonl",
        [{k: v for k, v in r.items() if "proxy3" not in k} for r in rows],
    )
    args = ["dynamics", "--log", str(mixed), "--log", str(clean), "--out", str(tmp_path / "d")]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    out = result.stdout
    report = json.loads((tmp_path / "d" / "collapse.json").read_text())
    by_run = {r["run"]: r for r in report["runs"]}
    assert by_run["mixed"]["proxy3_mixes_units"] and "mixed units" in by_run["mixed"]["units_note"]
    assert not by_run["clean"]["proxy3_mixes_units"] and by_run["clean"]["units_note"] is None
    assert "note (mixed): proxy3_pure_noise subtracts actor/grad_norm²" in out


def test_reads_a_wandb_csv_with_run_prefixes(tmp_path: Path) -> None:
    path = tmp_path / "export.csv"
    path.write_text(
        "Step,run-1 - actor/grad_norm,run-1 - actor/grad_norm__MIN,run-1 - actor/grad_norm__MAX,"
        "run-1 - critic/score/mean,run-1 - variance_proxy/proxy3_pure_noise\n"
        "2,0.4,0.3,0.5,0.2,0.01\n"
        "1,0.3,0.2,0.4,0.1,0.02\n"
        "3,0.5,0.4,0.6,,0.03\n"
    )
    log = read_training_log(path)
    assert log.source == "verl"
    assert log.frame["step"].tolist() == [1, 2, 3]
    assert log.frame["grad_norm"].tolist() == [0.3, 0.4, 0.5]
    assert log.frame["score"].iloc[:2].tolist() == [0.1, 0.2] and np.isnan(log.frame["score"][2])
    assert set(log.frame["variance_proxy_kind"]) == {"proxy3"}
    assert log.frame["tokens_sampled"].isna().all()


def test_reads_a_trl_trainer_state(tmp_path: Path) -> None:
    history = [
        {
            "step": s,
            "loss": 0.01,
            "grad_norm": 0.2 * s,
            "rewards/accuracy/mean": 0.1 * s,
            "rewards/accuracy/std": 0.3,
            "rewards/format/mean": 0.5,
            "completions/mean_length": 40.0,
            "num_tokens": 800.0 * s,
        }
        for s in (10, 20)
    ]
    history += [{"step": 20, "eval_loss": 0.5}, {"step": 20, "train_runtime": 9.0}]
    path = tmp_path / "trainer_state.json"
    path.write_text(json.dumps({"global_step": 20, "log_history": history}))
    log = read_training_log(path)
    assert log.source == "trl"
    assert log.frame["step"].tolist() == [10, 20]
    assert log.frame["score"].tolist() == pytest.approx([1.5, 2.5])  # accuracy + format means
    assert log.frame["tokens_sampled"].tolist() == [8000.0, 16000.0]
    assert log.frame["response_length"].tolist() == [40.0, 40.0]


def test_a_trl_step_logged_without_grad_norm_keeps_its_score(tmp_path: Path) -> None:
    """Under the knee controller TRL logs `grad_norm` at an update's last batch only (the gate
    withholds the others'); every training step's score is still a row."""
    history = [
        {"step": s, "loss": 0.01, "reward": 0.1 * s, "otb/controller/updates": u,
         **({"grad_norm": 0.5} if closes else {})}
        for s, u, closes in ((1, 0, True), (2, 1, False), (3, 1, True), (4, 2, True))
    ]  # fmt: skip
    path = tmp_path / "trainer_state.json"
    path.write_text(json.dumps({"global_step": 4, "log_history": history}))
    frame = read_training_log(path).frame
    assert frame["score"].tolist() == pytest.approx([0.1, 0.2, 0.3, 0.4])
    np.testing.assert_array_equal(frame["grad_norm"], [0.5, np.nan, 0.5, 0.5])
    assert frame["updates"].tolist() == [0, 1, 1, 2]


def test_a_trainer_state_cut_short_names_the_line_where_it_breaks(tmp_path: Path) -> None:
    """A pretty-printed trainer_state.json cut inside its log (as a copy stopped mid-write):
    the line where the JSON breaks, not line 1 of a JSONL reading, and the parser's complaint
    in one phrase (its "starting at" is not doubled)."""
    history = [{"step": s, "grad_norm": 1.0, "reward": 0.5} for s in range(1, 41)]
    text = json.dumps({"global_step": 40, "log_history": history}, indent=2)
    cut = text[: text.index('"reward"', len(text) // 2) + 4]  # inside a key, past half-way
    path = tmp_path / "trainer_state.json"
    path.write_text(cut)
    with pytest.raises(InputError) as err:
        read_training_log(path)
    assert err.value.line == cut.count("\n") + 1 > 100  # the last line, where it breaks
    assert "Unterminated string starting at column " in str(err.value)
    assert "at at" not in str(err.value) and "cut short" in str(err.value)
    # JSONL (one object a line) is still read as JSONL, not as a broken document
    rows = [{"step": 1, "mean_reward": 0.1, "grad_norm": 1.0}, {"step": 2, "mean_reward": 0.2,
            "grad_norm": 1.0}]  # fmt: skip
    assert read_training_log(write_jsonl(tmp_path / "metrics.jsonl", rows)).source == "otb-diag"


def test_unknown_keys_name_the_file_and_list_the_keys(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "other.jsonl", [{"epoch": 1, "lr": 0.1, "acc": 0.5}])
    with pytest.raises(InputError) as err:
        read_training_log(path)
    assert "other.jsonl" in str(err.value)
    assert "Keys found: acc, epoch, lr" in str(err.value)


def test_missing_score_names_the_field_and_lists_the_keys(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "verl.jsonl", [{"step": 1, "actor/grad_norm": 1.0}])
    with pytest.raises(InputError) as err:
        read_training_log(path)
    assert err.value.field == "critic/score/mean"
    assert "Keys found: actor/grad_norm, step" in str(err.value)


def test_a_bad_value_names_its_line_and_field(tmp_path: Path) -> None:
    rows = [
        {"step": 1, "mean_reward": 0.1, "grad_norm": 1.0},
        {"step": 2, "mean_reward": 0.2, "grad_norm": "big"},
    ]
    with pytest.raises(InputError) as err:
        read_training_log(write_jsonl(tmp_path / "metrics.jsonl", rows))
    assert (err.value.line, err.value.field) == (2, "grad_norm")


def test_a_decreasing_token_total_is_refused(tmp_path: Path) -> None:
    rows = [
        {"step": s, "mean_reward": 0.1, "grad_norm": 1.0, "tokens_sampled": t}
        for s, t in ((1, 100), (2, 50))
    ]
    with pytest.raises(InputError) as err:
        read_training_log(write_jsonl(tmp_path / "metrics.jsonl", rows))
    assert (err.value.line, err.value.field) == (2, "tokens_sampled")


@pytest.mark.parametrize(
    ("label", "expected"),
    [
        ("otb N=4", ("otb", 4)),
        ("grpo-n8", ("grpo", 8)),
        ("otb-loo", ("otb", None)),
        ("my run 3", (None, None)),
        ("rloo_n16_seed1", ("rloo", 16)),
    ],
)
def test_parse_label(label: str, expected: tuple) -> None:
    assert parse_label(label) == expected


# ---------------------------------------------------------------- CLI


@pytest.mark.slow  # runs a command end to end (a real run: seconds)
@pytest.mark.renders  # reads the rendered figures
def test_cli_writes_every_file(tmp_path: Path) -> None:
    ours = synthetic_run().rename(
        columns={
            "score": "mean_reward",
            "variance_proxy": "proxy2_total_power",
            "response_length": "mean_response_length",
        }
    )
    ours = ours.drop(columns=["variance_proxy_kind", "baseline", "group_size"])
    ours_path = write_jsonl(tmp_path / "ours.jsonl", ours.to_dict("records"))
    verl = synthetic_run(collapse_at=None, seed=1)
    verl_path = tmp_path / "verl.csv"
    verl.rename(
        columns={
            "step": "_step",
            "grad_norm": "run-7 - actor/grad_norm",
            "score": "critic/score/mean",
        }
    )[["_step", "run-7 - actor/grad_norm", "critic/score/mean"]].to_csv(verl_path, index=False)
    out = tmp_path / "out"
    args = ["dynamics", "--log", str(ours_path), "--log", str(verl_path)]
    args += ["--label", "otb N=4", "--label", "grpo N=8", "--target", "0.505", "--out", str(out)]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    figures = ["fig1_grad_norm_and_score", "fig2_variance_and_grad_norm", "score_vs_tokens"]
    for name in ["dynamics.csv", "collapse.json"] + [
        f"{f}.{e}" for f in figures for e in ("png", "pdf")
    ]:
        assert (out / name).stat().st_size > 0, name
    report = json.loads((out / "collapse.json").read_text())
    assert report["rule"]["threshold"] == 6.0 and report["rule"]["window"] == 30
    otb, grpo = report["runs"]
    assert (otb["baseline"], otb["group_size"], otb["collapse_step"], otb["lead_steps"]) == (
        "otb",
        4,
        300,
        40,
    )
    # 5-point trailing mean of 0.01 * point at point p is 0.01 * (p - 2): >= 0.505 at p = 53.
    assert otb["tokens_to_target"] == 54_000.0
    assert grpo["collapse_step"] is None and grpo["tokens_to_target"] is None
    table = pd.read_csv(out / "dynamics.csv")
    assert set(table["run"]) == {"otb N=4", "grpo N=8"} and len(table) == 400
    assert "otb N=4" in result.output and "rule:" in result.output


def test_label_count_must_match(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "m.jsonl", [{"step": 1, "mean_reward": 0.1, "grad_norm": 1.0}])
    with pytest.raises(InputError, match="2 --label for 1 --log"):
        dynamics([path], tmp_path / "out", ["a", "b"])
    with pytest.raises(InputError, match="1 --label for 2 --log"):  # checked before reading
        dynamics([tmp_path / "a.jsonl", tmp_path / "b.jsonl"], tmp_path / "out", ["only"])


def test_runs_sharing_baseline_and_size_get_distinct_colours() -> None:
    from otb_diag.plots.dynamics import _styles
    from otb_diag.plots.style import baseline_color

    def table(baselines: list[str], sizes: list[float]) -> pd.DataFrame:
        return pd.DataFrame(
            {
                "run": [f"r{i}" for i in range(len(baselines))],
                "baseline": baselines,
                "group_size": sizes,
            }
        )

    sweep = _styles(table(["mean", "mean", "mean"], [4, 4, 4]))  # a learning-rate sweep
    assert len({s["color"] for s in sweep.values()}) == 3
    mixed = _styles(table(["mean", "mean", "otb"], [4, 16, 4]))
    assert [s["color"] for s in mixed.values()] == [
        baseline_color("mean"),
        baseline_color("mean"),
        baseline_color("otb"),
    ]
    assert mixed["r0"]["linestyle"] != mixed["r1"]["linestyle"]


def test_fig1_draws_the_trailing_mean_over_the_faint_per_step_score() -> None:
    from otb_diag.plots.dynamics import fig1_grad_norm_and_score

    frame = synthetic_run(collapse_at=None, rise_at=None, seed=2)
    frame["score"] = np.random.default_rng(0).uniform(0, 1, len(frame))  # noisy, as 8 samples are
    result = analyse_run(frame, DetectionRule(smooth=5))
    table = frame.assign(run="r", score_smoothed=result.score_smoothed)
    fig = fig1_grad_norm_and_score(table, [SimpleNamespace(run="r", **result.summary())])
    curves = [ln for ln in fig.axes[1].get_lines() if len(ln.get_xdata()) == len(frame)]
    (faint,) = [ln for ln in curves if ln.get_alpha() is not None]
    (line,) = [ln for ln in curves if ln.get_alpha() is None]
    np.testing.assert_array_equal(np.asarray(faint.get_ydata(), float), frame["score"])
    expected = frame["score"].rolling(5, min_periods=5).mean().to_numpy()
    np.testing.assert_allclose(np.asarray(line.get_ydata(), float), expected, rtol=1e-12)
    assert "trailing mean" in fig.axes[1].get_title()


def test_fig1_keeps_the_per_step_score_of_a_run_too_short_for_the_mean() -> None:
    """A 3-step TRL run beside a long one: the long run gets its trailing mean, the short one
    (no mean within 5 points) keeps its score as a full line, not only a faint one."""
    from otb_diag.plots.dynamics import fig1_grad_norm_and_score

    rule = DetectionRule(smooth=5)
    frames, runs = [], []
    for name, n in (("long", 40), ("short", 3)):
        frame = synthetic_run(n=n, collapse_at=None, rise_at=None)
        result = analyse_run(frame, rule)
        frames.append(frame.assign(run=name, score_smoothed=result.score_smoothed))
        runs.append(SimpleNamespace(run=name, **result.summary()))
    fig = fig1_grad_norm_and_score(pd.concat(frames, ignore_index=True), runs)
    full = [ln for ln in fig.axes[1].get_lines() if ln.get_alpha() is None]
    short = [ln for ln in full if len(ln.get_xdata()) == 3]
    assert len(short) == 1
    np.testing.assert_array_equal(np.asarray(short[0].get_ydata(), float), frames[1]["score"])
    assert any(len(ln.get_xdata()) == 40 for ln in full)  # the long run's trailing mean


@pytest.mark.slow  # runs a command end to end (a real run: seconds)
@pytest.mark.renders  # reads the rendered figures
def test_runs_sharing_a_label_are_one_arms_seeds(tmp_path: Path) -> None:
    """Four logs, two labels: runs `label#k`, one arm per label with its tokens to the target
    (hand-computed from the planted score) and collapse verdict per run, in collapse.json,
    comparison.csv, the printed report and the comparison figure."""
    from otb_diag.pipelines.training_logs.recipe import run_dynamics
    from otb_diag.pipelines.training_logs.settings import DynamicsSettings, TrainingLogs

    logs = []
    for k, (collapse, tokens_per_point) in enumerate([(150, 1000), (None, 2000), (None, 1000)]):
        run = synthetic_run(collapse_at=collapse, seed=k)
        run["tokens_sampled"] = tokens_per_point * (np.arange(len(run)) + 1.0)
        ours = run.rename(columns={"score": "mean_reward", "variance_proxy": "proxy2_total_power",
                                   "response_length": "mean_response_length"})  # fmt: skip
        ours = ours.drop(columns=["variance_proxy_kind", "baseline", "group_size"])
        logs.append(write_jsonl(tmp_path / f"run{k}.jsonl", ours.to_dict("records")))
    labels = ["otb N=4", "otb N=4", "grpo N=16"]
    result = run_dynamics(
        TrainingLogs(logs, labels), tmp_path / "out", DynamicsSettings(target=0.505)
    )
    assert [r.run for r in result.runs] == ["otb N=4#1", "otb N=4#2", "grpo N=16"]
    otb, grpo = result.arms
    # The 5-point trailing mean of 0.01·p first reaches 0.505 at point 53: 54 points' tokens.
    assert otb.tokens_to_target == [54_000.0, 108_000.0] and otb.reached == 2
    assert otb.tokens_to_target_mean == 81_000.0
    assert otb.tokens_to_target_low < 54_000.0 < 108_000.0 < otb.tokens_to_target_high
    assert otb.collapse_steps == [300, None] and otb.collapsed == 1
    assert (grpo.baseline, grpo.group_size, grpo.runs) == ("grpo", 16, ["grpo N=16"])
    table = pd.read_csv(tmp_path / "out" / "comparison.csv")
    assert table["arm"].tolist() == ["otb N=4", "grpo N=16"]
    assert table["collapse_steps"].tolist()[0] == "300; "
    assert (tmp_path / "out" / "baseline_comparison.png").stat().st_size > 0
    text = result.format()
    assert "comparison at equal tokens" in text and "8.1e+04 [" in text
    back = json.loads((tmp_path / "out" / "collapse.json").read_text())
    assert back["arms"][0]["tokens_to_target"] == [54_000.0, 108_000.0]
