"""Trainer artefacts in (issue 12): verl's rollout_data_dir, TRL completion logs, directories,
globs and --steps; impossible probabilities refused; the trainer's advantages audited; an
unexpected error reported in one paragraph with exit 3.

verl and TRL files are written here exactly the way the trainers write them:
- verl `RayPPOTrainer._dump_generations`: `{global_steps}.jsonl` in `trainer.rollout_data_dir`,
  one `json.dumps(entry, ensure_ascii=False)` per line with `input`, `output`, `gts`, `score`,
  `step` and every reward-extra-info list (e.g. `acc`);
- TRL `GRPOTrainer.log`: `pd.DataFrame({"step", "prompt", "completion", <reward fn>...,
  "advantage"}).to_parquet(output_dir/completions/completions_{step:05d}.parquet)`, with the
  advantage `(R - mean) / (std + 1e-4)` per group of `num_generations` (unbiased std).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from otb_diag.cli.common import DEBUG_ENV
from otb_diag.cli.main import app
from typer.testing import CliRunner
from unwritten_figures import unwritten_figures

from otb_diag.errors import InputError
from otb_diag.io.loading import group_rows, load_rollouts
from otb_diag.io.rollouts.probability_checks import TOLERANCE
from otb_diag.io.rollouts.sources import expand_rollouts
from otb_diag.io.rollouts.tokenize import check_vocab
from otb_diag.io.scenarios import DEFAULT_ROLLOUTS
from otb_diag.knobs import parse_steps

runner = CliRunner()


def default_rows(count: int = 48) -> list[dict]:
    """The first rows of the embedded rollouts (toy prompts the embedded tokenizer knows)."""
    lines = DEFAULT_ROLLOUTS.read_text().splitlines()[:count]
    return [json.loads(line) for line in lines]


def write_verl_dump(directory: Path, steps: list[int], per_step: int = 8) -> list[dict]:
    """verl's `_dump_generations` for each step: rows from the embedded rollouts."""
    directory.mkdir(parents=True, exist_ok=True)
    rows = default_rows(per_step * len(steps))
    written = []
    for k, step in enumerate(steps):
        entries = [
            {
                "input": r["prompt"],
                "output": r["response"],
                "gts": None,
                "score": r["reward"],
                "step": step,
                "acc": bool(r["reward"]),
            }
            for r in rows[k * per_step : (k + 1) * per_step]
        ]
        lines = [json.dumps(e, ensure_ascii=False) for e in entries]
        (directory / f"{step}.jsonl").write_text("\n".join(lines) + "\n")
        written += entries
    return written


def trl_advantages(rewards: np.ndarray, generations: int, eps: float = 1e-4) -> np.ndarray:
    """TRL's default GRPO advantage, float32 like the trainer: per block of `generations`."""
    r = rewards.astype(np.float32).reshape(-1, generations)
    mean = r.mean(axis=1, keepdims=True)
    std = r.std(axis=1, ddof=1, keepdims=True)
    return ((r - mean) / (std + np.float32(eps))).reshape(-1)


def write_trl_completions(
    output_dir: Path, steps: list[int], generations: int = 4, prompts: int = 2, **kw
) -> Path:
    """TRL's completion logs, one parquet per logged step, with two reward functions."""
    folder = output_dir / "completions"
    folder.mkdir(parents=True, exist_ok=True)
    rows = default_rows(512)
    # Two prompts per step, `generations` completions each (consecutive, as TRL orders them).
    by_prompt: dict[str, list[dict]] = {}
    for r in rows:
        by_prompt.setdefault(r["prompt"], []).append(r)
    groups = [v[:generations] for v in by_prompt.values() if len(v) >= generations]
    for k, step in enumerate(steps):
        chosen = groups[k * prompts : (k + 1) * prompts]
        flat = [r for g in chosen for r in g]
        accuracy = np.array([r["reward"] for r in flat])
        brevity = np.array([0.1 * (len(r["response"]) < 6) for r in flat])
        advantage = kw.get("advantage_fn", trl_advantages)(accuracy + brevity, generations)
        table = {
            "step": [step] * len(flat),
            "prompt": [r["prompt"] for r in flat],
            "completion": [r["response"] for r in flat],
            "accuracy_reward": accuracy.tolist(),
            "brevity_reward": brevity.tolist(),
            "advantage": advantage.tolist(),
        }
        pd.DataFrame(table).to_parquet(folder / f"completions_{step:05d}.parquet")
    return folder


# ------------------------------------------------------------- directories, globs, --steps


def test_verl_rollout_data_dir_is_read_in_step_order(tmp_path: Path) -> None:
    """Measured failure 3: a verl rollout_data_dir was 'unknown rollout file type'."""
    dump = tmp_path / "rollout_data"
    written = write_verl_dump(dump, steps=[10, 9, 2])  # written out of order on purpose
    files = expand_rollouts(dump)
    assert [f.name for f in files] == ["2.jsonl", "9.jsonl", "10.jsonl"]  # numeric order
    rollouts = load_rollouts(dump)
    assert rollouts.format == "verl-jsonl"
    assert [r.step for r in rollouts.responses] == [2] * 8 + [9] * 8 + [10] * 8
    # A group is one (step, input): groups never span two steps.
    for idx in group_rows(rollouts.responses).values():
        assert len({rollouts.responses[i].step for i in idx}) == 1
    by_step = {s: [w["score"] for w in written if w["step"] == s] for s in (2, 9, 10)}
    assert [r.reward for r in rollouts.responses] == by_step[2] + by_step[9] + by_step[10]

    result = runner.invoke(app, ["rollouts", "inspect", str(dump), "--json"])
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert (summary["rows"], summary["files"], summary["steps"]) == (24, 3, [2, 9, 10])


def test_glob_and_steps_filter(tmp_path: Path) -> None:
    dump = tmp_path / "rollout_data"
    write_verl_dump(dump, steps=[1, 2, 3, 4])
    rollouts = load_rollouts(str(dump / "*.jsonl"), steps="2-3")
    assert sorted({r.step for r in rollouts.responses}) == [2, 3]
    assert len(rollouts.files) == 4
    with pytest.raises(InputError, match="no rollout row has a step in 7-9"):
        load_rollouts(dump, steps="7-9")
    with pytest.raises(InputError, match="matches no rollout file"):
        load_rollouts(str(tmp_path / "nothing-*.jsonl"))
    for bad in ("3-1", "a-b", "1-2-3"):
        with pytest.raises(InputError, match="--steps"):
            parse_steps(bad)


def test_same_group_ids_in_two_files_stay_apart(tmp_path: Path) -> None:
    rows = [{"group": "g0", "prompt_ids": [1], "response_ids": [2], "reward": 1.0}] * 2
    for name in ("step-1.jsonl", "step-2.jsonl"):
        (tmp_path / name).write_text("".join(json.dumps(r) + "\n" for r in rows))
    rollouts = load_rollouts(tmp_path)
    assert list(group_rows(rollouts.responses)) == ["step-1/g0", "step-2/g0"]


# ------------------------------------------------------------------- TRL completion logs


def test_trl_completion_logs_are_recognised(tmp_path: Path) -> None:
    """Measured failure 4: TRL's completions parquet failed with "missing required field
    'group'"."""
    folder = write_trl_completions(tmp_path / "run", steps=[1, 2])
    rollouts = load_rollouts(tmp_path / "run")  # the output_dir: completions/ is found
    assert rollouts.format == "trl-parquet"
    assert len(rollouts.responses) == 16 and len(group_rows(rollouts.responses)) == 4
    frame = pd.concat([pd.read_parquet(p) for p in sorted(folder.iterdir())])
    expected = (frame["accuracy_reward"] + frame["brevity_reward"]).tolist()
    assert [r.reward for r in rollouts.responses] == pytest.approx(expected)
    assert [r.trainer_advantage for r in rollouts.responses] == pytest.approx(
        frame["advantage"].tolist()
    )
    assert [r.response for r in rollouts.responses] == frame["completion"].tolist()

    only = load_rollouts(folder / "completions_00001.parquet", reward_columns=["accuracy_reward"])
    assert [r.reward for r in only.responses] == frame["accuracy_reward"].tolist()[:8]
    with pytest.raises(InputError, match="no column 'nope'"):
        load_rollouts(folder / "completions_00001.parquet", reward_columns=["nope"])


def test_trl_conversational_prompt_and_chat_template(tmp_path: Path) -> None:
    """Messages are read as text; with --chat-template the tokenizer's template renders them."""
    from tiny import char_tokenizer

    from otb_diag.io.rollouts.tokenize import prompts_without_template, tokenize_rollouts

    table = {
        "step": [1, 1],
        "prompt": [[{"role": "user", "content": "ab"}]] * 2,
        "completion": [
            [{"role": "assistant", "content": "c"}],
            [{"role": "assistant", "content": "d"}],
        ],
        "r": [1.0, 0.0],
        "advantage": [0.7, -0.7],
    }
    path = tmp_path / "completions_00001.parquet"
    pd.DataFrame(table).to_parquet(path)
    rollouts = load_rollouts(path)
    assert [r.prompt for r in rollouts.responses] == ["ab", "ab"]
    assert [r.response for r in rollouts.responses] == ["c", "d"]
    tok = char_tokenizer()
    assert prompts_without_template(rollouts, tok) == 0  # no template: nothing to say
    tok.chat_template = "{% for m in messages %}<eos>{{ m['content'] }}{% endfor %}z"
    assert prompts_without_template(rollouts, tok) == 2
    tokenized, _ = tokenize_rollouts(rollouts, tok, chat_template=True)
    assert tokenized.responses[0].prompt_ids == tok.encode("<eos>abz", add_special_tokens=False)


# ------------------------------------------------------------------ advantage audit


def energy_summary(args: list[str], tmp_path: Path) -> dict:
    """`otb-diag energy` with `args`: its summary and printout (figures not rendered)."""
    with unwritten_figures():
        result = runner.invoke(app, ["energy", *args, "--out", str(tmp_path / "out"), "--quiet"])
    assert result.exit_code == 0, result.output
    return json.loads((tmp_path / "out" / "summary.json").read_text()), result.stdout


def test_trl_advantages_agree_with_grpo_eps_1e_4(tmp_path: Path) -> None:
    write_trl_completions(tmp_path / "run", steps=[1, 2])
    summary, printed = energy_summary(["--rollouts", str(tmp_path / "run")], tmp_path)
    audit = summary["advantage_audit"]
    assert (audit["trainer"], audit["baseline"], audit["options"]["eps"]) == ("trl", "grpo", 1e-4)
    assert audit["agrees"] and audit["max_abs_diff"] < 1e-5
    assert audit["responses"] == 16
    assert "advantages   trl logged vs registry 'grpo' (ε=0.0001)" in printed
    assert "agree" in printed


def test_advantages_of_another_estimator_are_reported(tmp_path: Path) -> None:
    """A trainer that divides by the biased std (a silent mismatch) is caught."""

    def biased(rewards: np.ndarray, generations: int) -> np.ndarray:
        r = rewards.reshape(-1, generations)
        return ((r - r.mean(1, keepdims=True)) / (r.std(1, keepdims=True) + 1e-4)).reshape(-1)

    write_trl_completions(tmp_path / "run", steps=[1], advantage_fn=biased)
    summary, printed = energy_summary(["--rollouts", str(tmp_path / "run")], tmp_path)
    audit = summary["advantage_audit"]
    assert not audit["agrees"]
    # The biased std is sqrt((N-1)/N) of the unbiased one: each mixed group's advantages are
    # about sqrt(4/3) times TRL's; the audit's gap is exactly the largest difference.
    frame = pd.read_parquet(next((tmp_path / "run/completions").iterdir()))
    rewards = (frame["accuracy_reward"] + frame["brevity_reward"]).to_numpy()
    gap = np.abs(frame["advantage"].to_numpy() - trl_advantages(rewards, 4)).max()
    assert gap > 0.1
    assert audit["max_abs_diff"] == pytest.approx(gap, rel=1e-4)
    assert "DIFFER" in printed


@pytest.mark.slow  # energy runs over verl dumps
def test_verl_rows_with_advantages_need_the_trainer_baseline(tmp_path: Path) -> None:
    rows = [
        {"group": "g", "prompt_ids": [5, 6], "response_ids": [7, 8], "reward": r, "step": 1}
        for r in (0.0, 1.0, 1.0)
    ]
    mean = 2 / 3
    for row in rows:  # verl's Dr.GRPO (`mean` baseline): A = R - mean, per token
        row["trainer_advantage"] = [row["reward"] - mean] * 2
    path = tmp_path / "r.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    summary, printed = energy_summary(["--rollouts", str(path)], tmp_path)
    assert "--trainer-baseline" in summary["advantage_audit"]["skipped"]
    summary, _ = energy_summary(["--rollouts", str(path), "--trainer-baseline", "mean"], tmp_path)
    assert summary["advantage_audit"]["agrees"]
    assert summary["advantage_audit"]["tokens"] == 6
    summary, _ = energy_summary(["--rollouts", str(path), "--trainer-baseline", "rloo"], tmp_path)
    # rloo = N/(N-1) * mean: the largest gap is on the 0-reward row, |2/3 - 1| = 1/3.
    assert summary["advantage_audit"]["max_abs_diff"] == pytest.approx(1 / 3, rel=1e-5)


@pytest.mark.slow  # energy runs over the rows
def test_rows_recording_their_estimator_are_audited_against_it(tmp_path: Path) -> None:
    """Rows with `advantage_estimator` (attach's dumps) are audited against it unasked, its
    options included; --trainer-baseline still wins; rows of one audit naming two estimators
    are refused, naming the first that differs."""
    rows = [
        {
            "group": "g",
            "prompt_ids": [5, 6],
            "response_ids": [7, 8],
            "reward": r,
            "step": 1,
            "trainer_advantage": (r - 2 / 3) / (0.5773502691896258 + 1e-3),
            "advantage_estimator": {"baseline": "grpo", "options": {"eps": 1e-3}},
        }
        for r in (0.0, 1.0, 1.0)
    ]  # fmt: skip  (grpo: (R − mean)/(std + ε), the unbiased std of 0, 1, 1 is 1/√3)
    path = tmp_path / "r.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    summary, _ = energy_summary(["--rollouts", str(path)], tmp_path)
    audit = summary["advantage_audit"]
    assert (audit["baseline"], audit["options"]["eps"], audit["agrees"]) == ("grpo", 1e-3, True)
    summary, _ = energy_summary(["--rollouts", str(path), "--trainer-baseline", "mean"], tmp_path)
    assert summary["advantage_audit"]["baseline"] == "mean"
    assert not summary["advantage_audit"]["agrees"]
    rows[2]["advantage_estimator"] = {"baseline": "otb", "options": {}}
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    result = runner.invoke(app, ["energy", "--rollouts", str(path), "--out", str(tmp_path / "x")])
    assert result.exit_code == 2
    assert f"{path}, line 3, field 'advantage_estimator'" in result.output
    assert "one audit checks one estimator" in result.output


# ------------------------------------------------------ physical consistency (failure 5)


def model_free_row(**fields) -> dict:
    row = {
        "group": "g",
        "prompt_ids": [1, 2],
        "response_ids": [3, 4, 5],
        "reward": 1.0,
        "logprobs": [-0.5, -1.0, -0.1],
        "sum_pi2": [0.5, 0.3, 0.9],
    }
    return {**row, **fields}


p_sq = math.exp(-1.0)  # p² of logprob -0.5


@pytest.mark.parametrize(
    ("fields", "field", "words"),
    [
        ({"sum_pi2": [p_sq / 2, 0.3, 0.9]}, "sum_pi2", "position 0: value 0.18"),
        ({"logprobs": [-0.5, 0.5, -0.1]}, "logprobs", "position 1: value 0.5"),
        (
            {"sum_pi2": [0.5, 1.5, 0.9]},
            "sum_pi2",
            "position 1: value 1.5 breaks the rule sum_pi2 ≤ 1",
        ),
        ({"sum_pi2": [0.5, 0.0, 0.9]}, "sum_pi2", "rule sum_pi2 > 0"),
        ({"is_weights": [1.0, -0.1, 1.0]}, "is_weights", "rule is_weights ≥ 0"),
        ({"old_log_probs": [-0.5, -1.0, 0.2], "logprobs": None}, "old_log_probs", "logprobs ≤ 0"),
    ],
)
def test_impossible_probabilities_are_refused(
    tmp_path: Path, fields: dict, field: str, words: str
) -> None:
    """Measured failure 5: sum_pi2 < p², a positive logprob, sum_pi2 = 1.5 were accepted."""
    rows = [model_free_row(), model_free_row(**fields), model_free_row()]
    path = tmp_path / "r.jsonl"
    path.write_text(
        "".join(json.dumps({k: v for k, v in r.items() if v is not None}) + "\n" for r in rows)
    )
    out = tmp_path / "out"
    result = runner.invoke(
        app, ["energy", "--model-free", "--rollouts", str(path), "--out", str(out)]
    )
    assert result.exit_code == 2, result.output
    assert result.stderr.startswith(f"otb-diag: error: {path}, line 2, field '{field}': ")
    assert words in result.stderr and "rule" in result.stderr
    assert not out.exists()  # nothing written


def test_round_off_within_tolerance_is_clamped_and_counted(tmp_path: Path) -> None:
    small = TOLERANCE / 2
    row = model_free_row(logprobs=[small, -1.0, -0.1], sum_pi2=[1 + small, 0.3, 0.9])
    path = tmp_path / "r.jsonl"
    path.write_text(json.dumps(row) + "\n" + json.dumps(model_free_row()) + "\n")
    (r, _) = load_rollouts(path).responses
    assert r.logprobs[0] == 0.0 and r.sum_pi2[0] == 1.0
    summary, _ = energy_summary(["--model-free", "--rollouts", str(path)], tmp_path)
    assert summary["consistency"] == {
        "tolerance": TOLERANCE,
        "clamped": {"logprobs": 1, "sum_pi2": 1},
    }
    # With the clamp, w = 1 - 2p + Σπ² = 0 for the certain token, never negative.
    tokens = pd.read_parquet(tmp_path / "out" / "tokens.parquet")
    assert tokens["w"].min() >= 0 and tokens["w"].iloc[0] == pytest.approx(0.0, abs=1e-7)


# ------------------------------------------------------------- vocabulary (failure 7)


def test_out_of_vocab_rows_with_logged_stats_suggest_model_free(tmp_path: Path) -> None:
    """Measured failure 7: rows with logprobs and sum_pi2 failed on vocabulary without
    suggesting --model-free."""
    path = tmp_path / "r.jsonl"
    rows = [model_free_row(response_ids=[3, 4, 50_000]), model_free_row()]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    result = runner.invoke(app, ["energy", "--rollouts", str(path), "--out", str(tmp_path / "o")])
    assert result.exit_code == 2, result.output
    assert "line 1, field 'response_ids'" in result.stderr
    assert "--model-free" in result.stderr and "--ckpt" in result.stderr
    plain = load_rollouts(path)
    with pytest.raises(InputError) as err:
        check_vocab(type(plain)(plain.path, plain.format, [plain.responses[0]]), 22)
    assert "--model-free" in str(err.value)


# ------------------------------------------------------------------- never a traceback


def test_unexpected_error_is_one_paragraph_and_exit_3(monkeypatch, tmp_path: Path) -> None:
    import otb_diag.pipelines.inspect.recipe as inspect_pipeline

    def broken(*args, **kwargs):
        raise ZeroDivisionError("planted")

    monkeypatch.setattr(inspect_pipeline, "run_inspect", broken)
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    monkeypatch.setenv(DEBUG_ENV, "")  # restored after the test (--debug sets it)
    result = runner.invoke(app, ["rollouts", "inspect"])
    assert result.exit_code == 3
    message = result.stderr.strip().splitlines()[-1]  # after the notes on defaults
    assert message.startswith("otb-diag: internal error: 'inspect' failed unexpectedly")
    assert "ZeroDivisionError: planted" in message
    (saved,) = tmp_path.glob("otb-diag-inspect-*.txt")
    assert str(saved) in message and "Traceback" in saved.read_text()
    assert "--debug" in message

    debug = runner.invoke(app, ["--debug", "rollouts", "inspect"])
    assert isinstance(debug.exception, ZeroDivisionError)  # the traceback goes through
