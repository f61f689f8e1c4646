"""`otb-diag figures --quick` regenerates every figure of the set (what each figure draws is
checked on its tables in tests/plots/test_figures_from_tables.py)."""

import json
from pathlib import Path

import pytest
from otb_diag.cli.main import app
from typer.testing import CliRunner

# slow: runs whole figure sets (energy, variance-compare, trainings)
pytestmark = pytest.mark.slow

EXPECTED = [
    "fig1_grad_norm_and_score", "fig2_variance_and_grad_norm", "fig3_sequence_energy",
    "fig4_cumulative_energy", "fig5_probability_vs_gradient", "fig_energy_by_step",
    "variance_vs_n_head", "ratio_to_mean_head", "knee_tokens_head", "proxy_fidelity",
    "score_vs_tokens",
]  # fmt: skip


def test_quick_figures_produce_every_file(tmp_path: Path) -> None:
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


def test_quick_long_figures_run_the_sweep(tmp_path: Path) -> None:
    """`figures --scenario long --quick`: the sweep runs mean at each rate, the chosen rate is
    the rule's (`choose_lr`), otb and optseq train at it, and the sweep figure is written."""
    result = CliRunner().invoke(
        app,
        ["figures", "--quick", "--scenario", "long", "--out", str(tmp_path), "--quiet"],
    )
    assert result.exit_code == 0, result.output
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
