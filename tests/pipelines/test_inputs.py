"""The entry points resolve what the command line gave (`otb_diag/pipelines/inputs.py:Inputs`,
a lone --ckpt, a scenario) and say so through `say`, with the words the CLI prints."""

import json
from pathlib import Path

import numpy as np
import pytest
from otb_diag.cli.main import app
from tiny import save_checkpoint
from typer.testing import CliRunner

from otb_diag.errors import InputError
from otb_diag.io.scenarios import default_checkpoint
from otb_diag.pipelines import rl_training
from otb_diag.pipelines.energy.recipe import EnergySettings, run_energy
from otb_diag.pipelines.inputs import EnergyInputs, Inputs
from otb_diag.pipelines.variance.recipe import VarianceSettings, run_variance

runner = CliRunner()


@pytest.fixture(scope="module")
def templated(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny checkpoint whose tokenizer has a chat template."""
    path = tmp_path_factory.mktemp("ckpt") / "checkpoint-1"
    save_checkpoint(path)
    config = json.loads((path / "tokenizer_config.json").read_text())
    config["chat_template"] = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    (path / "tokenizer_config.json").write_text(json.dumps(config))
    return path


def write_rollouts(path: Path, prompt_ids: bool) -> Path:
    """2 groups x 3 responses with text prompts (with or without their ids), logprobs and
    sum_pi2."""
    rng = np.random.default_rng(0)
    rows = []
    for g in range(2):
        for k in range(3):
            n = int(rng.integers(2, 6))
            rows.append(
                {
                    "group": f"g{g}",
                    "prompt": "ab"[: g + 1],
                    "response_ids": rng.integers(2, 28, size=n).tolist(),
                    "logprobs": [-0.5] * n,
                    "sum_pi2": [0.4] * n,
                    "reward": float(k % 2),
                }
                | ({"prompt_ids": [2 + g]} if prompt_ids else {})
            )
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.fixture(scope="module")
def text_rollouts(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_rollouts(tmp_path_factory.mktemp("data") / "text.jsonl", prompt_ids=False)


@pytest.mark.slow  # runs a command end to end (a real run: seconds)
def test_energy_says_when_prompts_miss_the_chat_template(
    templated: Path, text_rollouts: Path, tmp_path: Path
) -> None:
    said: list[str] = []
    given = EnergyInputs(ckpt=[templated], rollouts=text_rollouts)
    run_energy(given, tmp_path / "out", EnergySettings(), progress=False, say=said.append)
    assert said == [
        "note: 6 prompts were tokenized without the checkpoint's chat template; trainers dump "
        "text without special tokens, so if the trainer applied the template, pass "
        "--chat-template (or dump exact ids: see the README)"
    ]


@pytest.mark.slow  # runs a command end to end (a real run: seconds)
def test_model_free_energy_says_it_ignores_the_checkpoint(templated: Path, tmp_path: Path) -> None:
    rollouts = write_rollouts(tmp_path / "ids.jsonl", prompt_ids=True)
    said: list[str] = []
    given = EnergyInputs(ckpt=[templated], rollouts=rollouts, model_free=True)
    result = run_energy(given, tmp_path / "out", progress=False, say=said.append)
    assert said == ["--model-free given: ignoring --ckpt"]
    assert result is not None and result.mode == "model-free"
    args = ["energy", "--model-free", "--ckpt", str(templated), "--rollouts", str(rollouts)]
    cli = runner.invoke(app, [*args, "--out", str(tmp_path / "cli"), "--quiet"])
    assert cli.exit_code == 0, cli.output
    assert "--model-free given: ignoring --ckpt" in cli.stderr


def test_variance_checks_its_settings_before_looking_up_a_default(tmp_path: Path) -> None:
    """A bad value stops before anything: when the settings are built (a knob's own check), or
    at the top of the entry point (a name its registry lacks), before the scenario's rollouts
    and checkpoint are looked up, so no note about them."""
    with pytest.raises(InputError, match="--mode: must be one of proxy, head, full, got 'nope'"):
        VarianceSettings(modes=("nope",))
    said: list[str] = []
    settings = VarianceSettings(baselines=("none", "mean", "nope"))
    with pytest.raises(InputError, match="unknown baseline 'nope'"):
        run_variance(Inputs(), tmp_path, settings, say=said.append)
    assert said == []


def test_train_starts_from_the_one_checkpoint_or_the_scenarios(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    started: list[Path] = []
    monkeypatch.setattr(rl_training, "train", lambda start, *_, **__: started.append(start))
    said: list[str] = []
    rl_training.run_train(Inputs(), tmp_path, progress=False, say=said.append)
    assert started == [default_checkpoint()]
    assert said == [f"no --ckpt given: using the embedded default {default_checkpoint()}"]
    with pytest.raises(InputError, match="training starts from one checkpoint"):
        rl_training.run_train(Inputs(ckpt=[tmp_path, tmp_path / "b"]), tmp_path, say=said.append)


def test_train_and_figures_refuse_the_files_they_do_not_read(tmp_path: Path) -> None:
    """train samples its own rollouts and figures runs on the scenario's own files: the API
    (the command line offers neither option) is told so before anything runs."""
    from otb_diag.pipelines.figures.recipe import run_figures

    with pytest.raises(InputError, match="--rollouts given, but train samples its own"):
        rl_training.run_train(Inputs(rollouts=tmp_path), tmp_path / "out")
    with pytest.raises(InputError, match="--ckpt given, but figures runs on the scenario's own"):
        run_figures(Inputs(ckpt=[tmp_path]), tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_lab_build_refuses_an_unknown_scenario_before_building(tmp_path: Path) -> None:
    result = runner.invoke(app, ["lab", "build", "--out", str(tmp_path), "--scenario", "nope"])
    assert result.exit_code == 2
    assert "--scenario: must be one of default, long, got 'nope'" in result.stderr
    assert not any(tmp_path.iterdir())
