"""`otb-diag figures --quick` regenerates every figure of the set (what each figure draws is
checked on its tables in tests/plots/test_figures_from_tables.py).

The set's energy and variance-compare runs read 4 groups x 32 responses of the scenario's
rollouts here (x 8 for the long scenario, whose quick plan draws N <= 4), not all of them:
what these tests check is that every part runs and every file is written, which does not need
the whole pools (the measurements themselves are tested beside their pipelines; the long
pools' own verdict in tests/lab/test_lab_long_shipped.py)."""

import json
from pathlib import Path

import pytest
from otb_diag.cli.main import app
from small_runs import figures, reduce_rollouts
from typer.testing import CliRunner

from otb_diag.io.scenarios import default_rollouts
from otb_diag.pipelines.rl_training import TrainSettings, scenario_settings

# slow: runs whole figure sets (energy, variance-compare, trainings)
pytestmark = pytest.mark.slow

EXPECTED = [
    "fig1_grad_norm_and_score", "fig2_variance_and_grad_norm", "fig3_sequence_energy",
    "fig4_cumulative_energy", "fig5_probability_vs_gradient", "fig_energy_by_step",
    "variance_vs_n_head", "ratio_to_mean_head", "knee_tokens_head", "proxy_fidelity",
    "score_vs_tokens",
]  # fmt: skip


@pytest.fixture
def fewer_rollouts(monkeypatch: pytest.MonkeyPatch, tmp_path_factory: pytest.TempPathFactory):
    """The figure set reads 4 groups x 32 responses of its scenario's rollouts (N <= 16 draws
    2N of a group), 4 x 8 of the long scenario's (N <= 4; its responses run to 400 tokens); its
    trainings sample 2 prompts a step, at most 32 tokens a response."""

    def reduced(scenario: str) -> Path:
        path = tmp_path_factory.mktemp("rollouts") / f"{scenario}.jsonl"
        responses = 8 if scenario == "long" else 32
        return reduce_rollouts(path, default_rollouts(scenario), groups=4, responses=responses)

    monkeypatch.setattr("otb_diag.pipelines.figures.recipe.scenario_rollouts", reduced)

    def shorter(scenario: str, **overrides: object) -> TrainSettings:
        return scenario_settings(
            scenario, **{**overrides, "prompts_per_step": 2}, max_new_tokens=32
        )

    monkeypatch.setattr("otb_diag.pipelines.figures.recipe.scenario_settings", shorter)


@pytest.mark.renders  # reads the rendered figures
def test_quick_figures_produce_every_file(tmp_path: Path, fewer_rollouts: None) -> None:
    args = ["figures", "--quick", "--out", str(tmp_path), "--quiet", "--json"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    for name in EXPECTED:
        assert (tmp_path / f"{name}.png").read_bytes()[:4] == b"\x89PNG", name
        assert (tmp_path / f"{name}.pdf").read_bytes()[:5] == b"%PDF-", name
    record = json.loads((tmp_path / "figures.json").read_text())
    assert json.loads(result.stdout) == record  # --json prints figures.json's content
    assert sorted(record["figures"]) == sorted(f"{n}.png" for n in EXPECTED)
    assert {r["run"] for r in record["collapse"]} == {
        "mean N=4",
        "mean N=16",
        "otb N=4",
        "optseq N=4",
    }


def test_quick_long_figures_run_the_sweep(tmp_path: Path, fewer_rollouts: None) -> None:
    """`figures --scenario long --quick`: the sweep runs mean at each rate, the chosen rate is
    the rule's (`choose_lr`), otb and optseq train at it, and the sweep figure is written (the
    files are checked, not rendered: `test_quick_figures_produce_every_file` renders them)."""
    figures(tmp_path, quick=True, scenario="long")
    record = json.loads((tmp_path / "figures.json").read_text())
    assert record["scenario"] == "long"
    sweep = record["sweep"]
    assert [r["lr"] for r in sweep["runs"]] == [1e-4, 1e-3]
    unstable = [r["lr"] for r in sweep["runs"] if r["unstable"]]
    assert sweep["chosen_lr"] == (min(unstable) if unstable else 1e-3)
    lr = f"{sweep['chosen_lr']:g}"
    assert {r["run"] for r in record["collapse"]} == {
        f"mean N=4 lr={lr}",
        f"otb N=4 lr={lr}",
        f"optseq N=4 lr={lr}",
    }
    assert (tmp_path / "lr_sweep_fig1_grad_norm_and_score.png").exists()
    for name in EXPECTED:  # the quick plan measures head mode, as the default's does
        assert (tmp_path / f"{name}.png").exists(), name
    assert record["paper_claim"], "the head mode gives a claim verdict at N=4"
