"""One source of truth (issue 19): every command computes a baseline's advantages with the same
estimator and reads what a baseline needs from its registry entry.

- On tool-use (TIR) rollouts with importance weights, `energy`'s `adv_otb`, the advantages a
  `variance-compare` draw uses, and verl's `tir_optimal_token_baseline` agree.
- A new energy-weighted baseline registered in a test runs through `energy` and
  `variance-compare` unchanged.
- The API and the CLI measure the same baselines by default.
- No module outside `maths/estimators/` computes advantages itself.
"""

from __future__ import annotations

import ast
import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from small_runs import invoke

from otb_diag.errors import InputError
from otb_diag.io.checkpoint import load_checkpoint
from otb_diag.io.loading import load_rollouts
from otb_diag.io.rollouts.to_batch import make_batch
from otb_diag.io.scenarios import DEFAULT_TIR_ROLLOUTS, default_checkpoint
from otb_diag.maths.aggregation import aggregation_weights
from otb_diag.maths.energy.tables import energy_tables
from otb_diag.maths.estimators import registry
from otb_diag.maths.estimators.advantages import Estimator, has_tool_output
from otb_diag.maths.estimators.otb import otb_baseline, verl_otb_advantage
from otb_diag.maths.returns import returns_to_go
from otb_diag.maths.variance.paired_draws import (
    BaselineSpec,
    draw_estimates,
    pool_rows,
    pool_score_means,
)
from otb_diag.pipelines.energy.recipe import EnergySettings
from otb_diag.pipelines.variance.recipe import VarianceSettings
from otb_diag.policy.forward_pass import checkpoint_stats

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def tir_batch():
    """Two groups of the shipped tool-use rollouts (g04's tool outputs shift the time axis, so
    TIR changes its OTB; g00's do not), with seeded importance weights ρ ∈ [0.5, 1.5], and
    their statistics under the embedded checkpoint."""
    rollouts = load_rollouts(DEFAULT_TIR_ROLLOUTS)
    keep = {"g00", "g04"}
    rollouts = replace(rollouts, responses=[r for r in rollouts.responses if r.group in keep])
    batch = make_batch(rollouts)
    assert has_tool_output(batch.mask, batch.valid)
    gen = torch.Generator().manual_seed(0)
    rho = (0.5 + torch.rand(batch.mask.shape, generator=gen)) * batch.valid
    batch = replace(batch, is_weights=rho)
    stats = checkpoint_stats(load_checkpoint(default_checkpoint()).model, batch)
    return batch, stats


def verl_tir_advantages(batch, stats) -> torch.Tensor:
    """verl's `tir_optimal_token_baseline` on the batch (its calling convention), in float64.

    verl rebuilds `w = 1 − 2p + Σπ²` from the logged `p` and `Σπ²`, which cancels in float32
    near p → 1; to compare estimators rather than that rounding, it is handed the `Σπ²` whose
    `1 − 2p + Σπ²` is the `w` our forward pass measured (exact in float64 to ~1e-16)."""
    logprob = stats.logprob.double()
    sum_pi2 = stats.w.double() - 1 + 2 * logprob.exp()
    advantages, _ = verl_otb_advantage(
        batch.token_rewards.double(), batch.mask.double(), batch.group, logprob, sum_pi2,
        rollout_is_weights=batch.is_weights.double(), tir=True,
    )  # fmt: skip
    return advantages.double()


def test_energy_and_variance_compare_use_verls_tir_otb(tir_batch) -> None:
    batch, stats = tir_batch
    expected = verl_tir_advantages(batch, stats)  # [B, T]
    on = batch.mask.bool()
    scale = expected[on].abs().max()

    # energy: adv_otb on the generated tokens, TIR decided from the rollouts.
    tokens = energy_tables(batch, stats, ["none", "mean", "otb"]).tokens
    generated = tokens[tokens["mask"] == 1]
    rows, cols = on.nonzero(as_tuple=True)
    np.testing.assert_allclose(
        generated["adv_otb"].to_numpy(), expected[rows, cols].numpy(), rtol=0, atol=1e-5 * scale
    )

    # variance-compare: one draw holding every pool member, scores e_{(b,t)} (one-hot per
    # token), so the token-sum estimate g is the coefficient c·A of every token.
    b, t = batch.mask.shape
    scores = torch.eye(b * t, dtype=torch.float64).view(b, t, b * t)
    pools = pool_rows(batch.group)
    rows_drawn = np.stack([p for p in pools])[None]  # [R = 1, P, M]
    returns = returns_to_go(batch.token_rewards, batch.mask)
    estimator = Estimator().resolved(batch.mask, batch.valid)
    assert estimator.tir
    estimates = draw_estimates(
        returns, batch.mask, scores, {"proxy": stats.w}, rows_drawn,
        pool_score_means(scores, batch.mask, batch.group),
        [BaselineSpec("none", "none"), BaselineSpec("otb", "otb", "proxy")], ["token-sum"],
        is_weights=batch.is_weights, estimator=estimator,
    )  # fmt: skip
    g = torch.as_tensor(estimates["token-sum", "otb"][0][0]).view(b, t)
    c = aggregation_weights("token-sum", batch.mask.double())  # 1/B on the mask
    torch.testing.assert_close(g[on] / c[on], expected[on], rtol=0, atol=1e-5 * float(scale))


def test_tir_and_weights_change_otb(tir_batch) -> None:
    """The agreement above is not vacuous: without TIR, or without ρ, OTB differs."""
    batch, stats = tir_batch
    expected = verl_tir_advantages(batch, stats)
    plain = energy_tables(batch, stats, ["otb"], estimator=Estimator(tir=False)).tokens
    unweighted = energy_tables(replace(batch, is_weights=None), stats, ["otb"]).tokens
    on = batch.mask.bool()
    rows, cols = on.nonzero(as_tuple=True)
    for table in (plain, unweighted):
        got = table[table["mask"] == 1]["adv_otb"].to_numpy()
        assert np.abs(got - expected[rows, cols].numpy()).max() > 1e-3


@pytest.fixture
def sqrt_otb(monkeypatch: pytest.MonkeyPatch) -> str:
    """A new energy-weighted baseline, registered as ARCHITECTURE.md says (one decorated
    function), and unregistered after the test."""
    name = "test-otb-sqrt"
    monkeypatch.setitem(registry.BASELINES, name, None)  # teardown removes the name again
    del registry.BASELINES[name]

    @registry.register_baseline(name, needs_energy=True, default=False)
    def otb_sqrt(returns, mask, group, energy, *, is_weights=None, tir=False):
        """OTB weighted by √W_t instead of W_t."""
        return otb_baseline(returns, mask, group, energy.clamp_min(0).sqrt(), tir=tir)

    return name


@pytest.mark.slow  # an energy and a variance-compare run
def test_a_registered_energy_baseline_runs_in_energy_and_variance_compare(
    sqrt_otb: str, reduced_rollouts: Path, tmp_path: Path
) -> None:
    ckpt = default_checkpoint()
    names = f"none,mean,otb,{sqrt_otb}"
    code, out = invoke(
        "energy", "--ckpt", ckpt, "--rollouts", reduced_rollouts, "--out", tmp_path / "e",
        "--baselines", names, "--quiet",
    )  # fmt: skip
    assert code == 0, out
    tokens = pd.read_parquet(tmp_path / "e" / "tokens.parquet")
    assert tokens[f"adv_{sqrt_otb}"].abs().sum() > 0
    assert not np.allclose(tokens[f"adv_{sqrt_otb}"], tokens["adv_otb"])
    code, out = invoke(
        "variance-compare", "--ckpt", ckpt, "--rollouts", reduced_rollouts,
        "--out", tmp_path / "v", "--baselines", names, "--mode", "proxy",
        "--group-sizes", "2,4", "--draws", "20", "--bootstrap", "50", "--quiet",
    )  # fmt: skip
    assert code == 0, out
    table = pd.read_csv(tmp_path / "v" / "variance.csv")
    assert (table.loc[table["baseline"] == sqrt_otb, "variance"] > 0).all()
    assert set(table["baseline"]) == set(names.split(","))


def test_api_and_cli_measure_the_same_baselines_by_default(
    reduced_rollouts: Path, tmp_path: Path
) -> None:
    defaults = registry.baseline_names(defaults_only=True)
    assert VarianceSettings().baselines == EnergySettings().baselines == defaults
    assert defaults == ("none", "mean", "grpo", "rloo", "optseq", "otb")
    code, out = invoke(
        "variance-compare", "--ckpt", default_checkpoint(), "--rollouts", reduced_rollouts,
        "--out", tmp_path / "v", "--mode", "proxy", "--group-sizes", "2", "--draws", "5",
        "--bootstrap", "10", "--quiet",
    )  # fmt: skip
    assert code == 0, out
    summary = json.loads((tmp_path / "v" / "summary.json").read_text())
    assert tuple(summary["settings"]["baselines"]) == defaults


def _advantage_recipes(path: Path) -> list[str]:
    """Calls in `path` that compute advantages without the one estimator: a registry entry
    called directly (`get_baseline(...)(...)`, `BASELINES[...](...)`, `.fn(...)`) or the old
    `compute_advantages`."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if not isinstance(node, ast.Call):
            continue
        f = node.func
        direct = isinstance(f, ast.Call) and getattr(f.func, "id", None) == "get_baseline"
        indexed = isinstance(f, ast.Subscript) and getattr(f.value, "id", None) == "BASELINES"
        attr = isinstance(f, ast.Attribute) and f.attr == "fn"
        old = getattr(f, "id", None) == "compute_advantages"
        if direct or indexed or attr or old:
            found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    return found


def test_only_the_estimator_computes_advantages() -> None:
    estimators = ROOT / "otb_diag" / "maths" / "estimators"
    sources = [
        p
        for p in [*(ROOT / "otb_diag").rglob("*.py"), *(ROOT / "cli").glob("*.py")]
        if estimators not in p.parents
    ]
    assert not [hit for p in sources for hit in _advantage_recipes(p)]


def test_the_registry_names_trainers_and_checks_names_before_any_work() -> None:
    assert registry.resolve_name("optimal_token_baseline") == "otb"
    assert registry.resolve_name("tir_optimal_token_baseline") == "otb"
    assert registry.resolve_name("rloo") == "rloo"
    assert registry.trainer_baseline("trl") == ("grpo", {"eps": 1e-4})
    assert registry.trainer_baseline("trl-rloo") == ("rloo", {})  # TRL's RLOOTrainer
    assert registry.trainer_baseline("verl") is None  # verl's estimator is whatever it was told
    assert registry.family_of("otb-loo-true") == "otb" and registry.variant_of("otb-loo") == "loo"
    with pytest.raises(InputError, match="known baselines: none, mean"):
        EnergySettings(baselines=("none", "nope")).check()
    with pytest.raises(InputError, match="unknown baseline 'gae'"):
        EnergySettings(trainer_baseline="gae").check()
    with pytest.raises(InputError, match="unknown baseline 'nope'"):
        VarianceSettings(baselines=("none", "mean", "nope")).check()
