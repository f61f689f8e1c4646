"""The real TRL: a `GRPOTrainer` runs a few steps on the embedded checkpoint on CPU with
`log_completions=True`, then `rollouts inspect`, `energy` and `dynamics` read what it wrote
(`checkpoint-*`, `checkpoint-*/trainer_state.json`, `completions/completions_*.parquet`)."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
from integrations.trl_toy import correct, short  # the toy reward functions of the live tests
from otb_diag.cli.main import app
from typer.testing import CliRunner

from otb_diag.io.scenarios import default_checkpoint

pytestmark = pytest.mark.external  # runs TRL's GRPOTrainer

runner = CliRunner()
PROMPTS = ["C:684=", "R:372=", "S:951=", "C:20=", "R:58=", "S:310=", "C:7=", "R:41="]
STEPS, GENERATIONS, PER_STEP = 3, 4, 8  # 2 prompts x 4 completions per step


def exact_ids(tokenizer):
    """The README's recipe for exact ids: a reward function of weight 0 that logs the prompt
    ids (TRL tokenizes a plain-text prompt as `processing_class(text=prompts)`) and the
    completion ids as extra columns of the completion log."""

    def log_ids(prompts, completions, completion_ids, log_extra, **_):
        log_extra("prompt_ids", [tokenizer(p)["input_ids"] for p in prompts])
        log_extra("response_ids", [list(ids) for ids in completion_ids])
        return [0.0] * len(prompts)

    return log_ids


@pytest.fixture(scope="module")
def trl_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    out = tmp_path_factory.mktemp("trl") / "grpo-toy"
    args = GRPOConfig(
        output_dir=str(out),
        per_device_train_batch_size=PER_STEP,
        num_generations=GENERATIONS,
        max_completion_length=12,
        max_steps=STEPS,
        logging_steps=1,
        save_steps=2,
        save_only_model=True,
        log_completions=True,
        report_to=[],
        use_cpu=True,
        learning_rate=1e-3,
        reward_weights=[1.0, 1.0, 0.0],
        seed=0,
        bf16=False,
        disable_tqdm=True,
    )
    ckpt = default_checkpoint()
    tokenizer = AutoTokenizer.from_pretrained(ckpt)
    trainer = GRPOTrainer(
        model=AutoModelForCausalLM.from_pretrained(ckpt),
        reward_funcs=[correct, short, exact_ids(tokenizer)],
        args=args,
        train_dataset=Dataset.from_dict({"prompt": PROMPTS}),
        processing_class=tokenizer,
    )
    trainer.train()
    return out


def test_trl_writes_what_we_read(trl_run: Path) -> None:
    names = sorted(p.name for p in (trl_run / "completions").iterdir())
    assert names == [f"completions_{s:05d}.parquet" for s in range(1, STEPS + 1)]
    frame = pd.read_parquet(trl_run / "completions" / names[0])
    assert list(frame.columns) == [
        *("step", "prompt", "completion", "correct", "short", "log_ids"),
        *("prompt_ids", "response_ids", "advantage"),
    ]
    assert sorted(p.name for p in trl_run.glob("checkpoint-*")) == ["checkpoint-2", "checkpoint-3"]


def test_exact_ids_recipe_keeps_the_end_token(trl_run: Path) -> None:
    """The text TRL logs lost the end marker (skip_special_tokens); the logged ids have it."""
    from transformers import AutoTokenizer

    from otb_diag.io.loading import load_rollouts

    rollouts = load_rollouts(trl_run)
    tokenizer = AutoTokenizer.from_pretrained(default_checkpoint())
    eos = tokenizer.eos_token_id
    ended = [r for r in rollouts.responses if r.response_ids and r.response_ids[-1] == eos]
    assert ended, "the toy model ends its answers with <end>"
    for r in ended:
        assert tokenizer.eos_token not in r.response  # gone from the text
        assert tokenizer.decode(r.response_ids, skip_special_tokens=True) == r.response


def test_rollouts_inspect_reads_the_output_dir(trl_run: Path) -> None:
    result = runner.invoke(app, ["rollouts", "inspect", str(trl_run), "--json"])
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert (summary["format"], summary["files"], summary["rows"]) == ("trl-parquet", 3, 24)
    assert summary["groups"] == STEPS * PER_STEP // GENERATIONS
    assert summary["group_size"]["counts"] == {str(GENERATIONS): 6}
    assert summary["steps"] == [1, 2, 3]


def test_energy_audits_trl_advantages(trl_run: Path, tmp_path: Path) -> None:
    out = tmp_path / "energy"
    args = ["energy", "--ckpt", str(trl_run), "--rollouts", str(trl_run), "--out", str(out)]
    result = runner.invoke(app, [*args, "--quiet"])
    assert result.exit_code == 0, result.output
    summary = json.loads((out / "summary.json").read_text())
    assert [Path(c["path"]).name for c in summary["inputs"]["checkpoints"]] == [
        "checkpoint-2",
        "checkpoint-3",
    ]
    audit = summary["advantage_audit"]
    assert (audit["trainer"], audit["baseline"], audit["responses"]) == ("trl", "grpo", 24)
    assert audit["agrees"], audit
    # Rewards and advantages the trainer logged are what energy used.
    frames = pd.concat(pd.read_parquet(p) for p in sorted((trl_run / "completions").iterdir()))
    sequences = pd.read_csv(out / "sequences.csv")
    final = sequences[sequences["step"] == 3]
    assert final["reward"].to_numpy() == pytest.approx(
        (frames["correct"] + frames["short"]).to_numpy()
    )


@pytest.mark.renders  # reads the rendered figures
def test_dynamics_reads_trainer_state(trl_run: Path, tmp_path: Path) -> None:
    out = tmp_path / "dynamics"
    state = trl_run / "checkpoint-3" / "trainer_state.json"
    result = runner.invoke(app, ["dynamics", "--log", str(state), "--out", str(out), "--json"])
    assert result.exit_code == 0, result.output
    (run,) = json.loads(result.stdout)["runs"]
    assert run["run"] == "grpo-toy"  # the run directory, not checkpoint-3
    assert (run["points"], run["first_step"], run["last_step"]) == (STEPS, 1, STEPS)
    assert (out / "fig1_grad_norm_and_score.png").stat().st_size > 0
