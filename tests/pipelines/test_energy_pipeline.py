"""`otb-diag energy` end to end on tiny real checkpoints saved with save_pretrained; its bad
inputs at the entry point (the CLI prints an `InputError` and exits 2: tests/cli)."""

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from otb_diag.cli.main import app
from small_runs import energy
from tiny import MODEL_VOCAB, save_checkpoint
from typer.testing import CliRunner

from otb_diag.errors import InputError

runner = CliRunner()

FIGURES = ["fig3_sequence_energy", "fig4_cumulative_energy", "fig5_probability_vs_gradient"]


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run directory holding two checkpoints of different weights (steps 5 and 10)."""
    root = tmp_path_factory.mktemp("run")
    save_checkpoint(root / "checkpoint-10", seed=1)
    save_checkpoint(root / "checkpoint-5", seed=2)
    return root


@pytest.fixture(scope="module")
def rollouts(tmp_path_factory: pytest.TempPathFactory) -> Path:
    rng = np.random.default_rng(0)
    rows = []
    for g in range(3):
        prompt = "abc"[: g + 1]
        for k in range(4):
            n = int(rng.integers(2, 12))
            ids = rng.integers(2, 28, size=n).tolist()
            rows.append(
                {
                    "group": f"g{g}",
                    "prompt": prompt,
                    "response_ids": ids,
                    "prompt_ids": [2 + g],
                    "reward": float(k % 2),
                }
            )
    path = tmp_path_factory.mktemp("data") / "rollouts.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.mark.slow  # runs a command end to end (a real run: seconds)
def test_energy_writes_every_output(run_dir: Path, rollouts: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    args = [
        "energy",
        "--ckpt",
        str(run_dir / "checkpoint-10"),
        "--rollouts",
        str(rollouts),
        "--out",
        str(out),
        "--quiet",
        "--json",
        "--batch-tokens",
        "32",
        "--chunk-size",
        "5",
    ]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert summary == json.loads((out / "summary.json").read_text())
    assert summary["inputs"]["checkpoints"][0]["path"] == str(run_dir / "checkpoint-10")
    assert len(summary["inputs"]["rollouts"]["sha256"]) == 64
    for name in FIGURES:
        assert (out / f"{name}.png").exists()  # content: tests/plots/test_figures_from_tables.py
        assert (out / f"{name}.pdf").exists()
    tokens = pd.read_parquet(out / "tokens.parquet")
    expected = [
        "group",
        "sample",
        "t",
        "token_id",
        "token",
        "mask",
        "logprob",
        "prob",
        "sum_pi2",
        "entropy",
        "w",
        "W",
        "return",
    ]
    assert list(tokens.columns[: len(expected)]) == expected
    assert "adv_otb" in tokens and "adv_rloo" in tokens
    assert tokens["token_id"].max() < MODEL_VOCAB
    seqs = pd.read_csv(out / "sequences.csv")
    assert list(seqs.columns[:4]) == ["group", "sample", "length", "reward"]
    assert "step" not in seqs  # one checkpoint
    groups = pd.read_csv(out / "groups.csv")
    assert {"energy_cv", "kendall_tau_50", "rank_changes"} <= set(groups.columns)
    proxies = json.loads((out / "proxies.json").read_text())
    assert set(proxies) == {"none", "mean", "grpo", "rloo", "optseq", "otb"}
    assert summary["figure_group"] in set(groups["group"])


@pytest.mark.slow  # runs a command end to end (a real run: seconds)
def test_energy_over_a_run_directory_gives_steps(run_dir: Path, rollouts: Path, tmp_path: Path):
    out = tmp_path / "out"
    result = runner.invoke(
        app,
        [
            "energy",
            "--ckpt",
            str(run_dir),
            "--rollouts",
            str(rollouts),
            "--out",
            str(out),
            "--quiet",
            "--baselines",
            "mean,otb",
        ],
    )
    assert result.exit_code == 0, result.output
    seqs = pd.read_csv(out / "sequences.csv")
    assert sorted(seqs["step"].unique()) == [5, 10]  # sorted by step, not by name
    # different weights, different energies
    e5 = seqs[seqs["step"] == 5]["energy"].to_numpy()
    e10 = seqs[seqs["step"] == 10]["energy"].to_numpy()
    assert not np.allclose(e5, e10)
    assert (out / "fig_energy_by_step.png").exists()
    assert set(json.loads((out / "proxies.json").read_text())) == {"5", "10"}
    assert "wrote" in result.stdout and "otb" in result.stdout


@pytest.mark.filterwarnings("error::RuntimeWarning")
def test_rewards_without_signal_are_said_first(run_dir: Path, rollouts: Path, tmp_path: Path):
    """Every reward 0: the energies are measured all the same (they need no reward), the
    summary opens by saying there is no signal, and no NaN is written or warned about."""
    flat = tmp_path / "flat.jsonl"
    rows = [json.loads(line) for line in rollouts.read_text().splitlines()]
    flat.write_text("".join(json.dumps({**r, "reward": 0.0}) + "\n" for r in rows))
    result = energy(flat, tmp_path / "out", run_dir / "checkpoint-10")
    assert result is not None
    text = result.format()
    assert text.startswith("no signal: each of the 3 groups has equal rewards within it")
    # every reward 0: every row is 0, none's too, and the sentence names the others
    others = [name for name in result.proxies if name != "none"]
    assert all(row.is_zero() for row in result.proxy_rows().values())
    assert f"the proxies of {', '.join(others[:-1])} and {others[-1]} below are 0" in text
    assert "zero tail" not in text
    assert "NaN" not in (tmp_path / "out" / "summary.json").read_text()
    assert result.energy.groups_with_mixed_rewards == 0


def test_unknown_group_fails_cleanly(run_dir: Path, rollouts: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    with pytest.raises(InputError) as err:
        energy(rollouts, out, ckpt=run_dir / "checkpoint-5", group="zz")
    assert "field 'group'" in str(err.value) and "g0" in str(err.value)
    assert not out.exists()  # nothing half-written


def test_ids_beyond_the_vocabulary(run_dir: Path, tmp_path: Path) -> None:
    path = tmp_path / "r.jsonl"
    row = {"group": 0, "prompt_ids": [2], "response_ids": [3, MODEL_VOCAB + 5], "reward": 1.0}
    path.write_text(json.dumps(row) + "\n")
    with pytest.raises(InputError) as err:
        energy(path, tmp_path / "o", ckpt=run_dir / "checkpoint-5")
    assert str(path) in str(err.value) and "line 1" in str(err.value)
    assert "response_ids" in str(err.value)


def test_model_free_needs_sum_pi2(rollouts: Path, tmp_path: Path) -> None:
    with pytest.raises(InputError, match="logprobs|sum_pi2"):
        energy(rollouts, tmp_path / "o", model_free=True)


def test_tokenizer_that_does_not_match_the_checkpoint(run_dir: Path, rollouts, tmp_path: Path):
    import shutil

    from tiny import char_tokenizer

    ckpt = Path(shutil.copytree(run_dir / "checkpoint-5", tmp_path / "checkpoint-5"))
    char_tokenizer(n_letters=40).save_pretrained(ckpt)  # 43 tokens > 30 rows
    with pytest.raises(InputError, match="tokenizer does not match the checkpoint"):
        energy(rollouts, tmp_path / "o", ckpt=ckpt)
