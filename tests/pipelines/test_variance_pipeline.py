"""`otb-diag variance-compare` end to end on a tiny real checkpoint."""

import json
import math
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from otb_diag.cli.main import app
from tiny import save_checkpoint
from typer.testing import CliRunner

from otb_diag.pipelines.results.variance import HeadlineRow

runner = CliRunner()

COLUMNS = [
    "mode",
    "aggregation",
    "baseline",
    "group_size",
    "variance",
    "ci_low",
    "ci_high",
    "ratio_to_mean",
    "bias_z",
    "equivalent_mean_group_size",
    "token_savings",
]


@pytest.fixture(scope="module")
def inputs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("vc")
    save_checkpoint(root / "checkpoint-3", seed=3)
    rng = np.random.default_rng(1)
    rows = []
    for g in range(3):
        for _ in range(8):
            n = int(rng.integers(2, 10))
            rows.append(
                {
                    "group": g,
                    "prompt_ids": [2 + g, 5],
                    "reward": float(rng.random() < 0.5),
                    "response_ids": rng.integers(2, 28, size=n).tolist(),
                }
            )
    rows[0]["reward"], rows[1]["reward"] = 1.0, 0.0  # at least one mixed group
    for k in range(8):  # and one whose rewards are all equal
        rows[16 + k]["reward"] = 1.0
    path = root / "pool.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return root / "checkpoint-3", path


def run(inputs, out: Path, *extra: str):
    ckpt, rollouts = inputs
    return runner.invoke(
        app,
        [
            "variance-compare",
            "--ckpt",
            str(ckpt),
            "--rollouts",
            str(rollouts),
            "--out",
            str(out),
            "--quiet",
            "--draws",
            "20",
            "--bootstrap",
            "50",
            "--sketch-dim",
            "16",
            *extra,
        ],
    )


@pytest.mark.slow  # runs a command end to end (a real run: seconds)
def test_all_modes_write_tables_and_figures(inputs, tmp_path: Path) -> None:
    out = tmp_path / "out"
    result = run(inputs, out, "--mode", "proxy,head,full", "--group-sizes", "2,4,8")
    assert result.exit_code == 0, result.output
    table = pd.read_csv(out / "variance.csv")
    assert list(table.columns[: len(COLUMNS)]) == COLUMNS
    assert set(table["mode"]) == {"proxy", "head", "full"}
    assert sorted(table["group_size"].unique()) == [2, 4]  # capped at M/2 = 4
    full = table[table["mode"] == "full"]
    assert {"otb-true", "optseq-true", "optseq-seqnorm-true"} <= set(full["baseline"])
    assert "otb-seqnorm-true" not in set(full["baseline"])  # OTB takes per-token norms only
    assert (table["ci_low"] <= table["variance"]).all()
    assert (table["variance"] <= table["ci_high"]).all()
    mean_rows = table[table["baseline"] == "mean"]
    np.testing.assert_allclose(mean_rows["ratio_to_mean"], 1.0)
    fid = pd.read_csv(out / "fidelity.csv")
    assert set(fid["mode"]) == {"head", "full"}
    assert fid["token_spearman"].between(-1, 1).all()
    summary = json.loads((out / "summary.json").read_text())
    assert summary["draws"]["full@3"]["constant_pools"] == 1
    for name in ["variance_vs_n_full", "ratio_to_mean_head", "proxy_fidelity"]:
        assert (out / f"{name}.png").exists()  # content: tests/plots/test_figures_from_tables.py
    assert "OTB/mean" in result.stdout
    assert "noise of a step (full mode, token-sum)" in result.stdout
    assert f"recommendation: {summary['noise_scale']['text']}" in result.stdout
    # N = 4 measured, N′ read off N ≤ 4 (pools of 8): a verdict per mode, printed as well
    assert [c["mode"] for c in summary["paper_claim"]] == ["proxy", "head", "full"]
    for claim in summary["paper_claim"]:
        assert claim["verdict"] in ("not reproduced", "undecided")
        assert f"paper's claim, {claim['mode']} mode: {claim['text']}." in result.stdout


def test_noise_scale_split_knee_and_recommendation(runs: Path) -> None:
    """The session run (proxy and full modes, reduced default): noise_scale.csv holds the split
    and the knee with intervals per baseline and N; proxy rows claim no knee; summary.json
    carries the recommendation and the printed knee rows; the figure of the knee exists."""
    out = runs / "variance"
    noise = pd.read_csv(out / "noise_scale.csv")
    variance = pd.read_csv(out / "variance.csv")
    keys = ["mode", "aggregation", "baseline", "group_size"]
    assert len(noise) == len(variance)
    assert noise[keys].equals(variance[keys])
    np.testing.assert_allclose(noise["total"], noise["within"] + noise["between"], rtol=1e-12)
    for name in ("within", "between", "total", "within_share"):
        assert (noise[f"{name}_low"] <= noise[name]).all()
        assert (noise[name] <= noise[f"{name}_high"]).all()
    proxy, full = noise[noise["mode"] == "proxy"], noise[noise["mode"] == "full"]
    assert proxy["noise_scale"].isna().all() and not proxy["grad_sq_resolved"].any()
    assert full["grad_sq"].notna().all()
    resolved = full[full["grad_sq_resolved"]]
    np.testing.assert_allclose(resolved["noise_scale"], resolved["total"] / resolved["grad_sq"])
    np.testing.assert_allclose(
        resolved["noise_scale_tokens"],
        resolved["noise_scale"] * resolved["group_size"] * resolved["mean_response_tokens"],
    )
    summary = json.loads((out / "summary.json").read_text())
    advice = summary["noise_scale"]
    assert advice["mode"] == "full" and advice["prompts"] == 4 and advice["few_prompts"]
    assert "only 4 prompts" in advice["text"]
    assert summary["knee"]["mode"] == "full"
    assert len(summary["knee"]["rows"]) == len(full[full["aggregation"] == "token-sum"])
    assert (out / "knee_tokens_full.png").exists()


@pytest.mark.slow  # three variance-compare runs
def test_same_seed_same_numbers(inputs, tmp_path: Path) -> None:
    a = run(inputs, tmp_path / "a", "--mode", "head", "--group-sizes", "2,4", "--seed", "7")
    b = run(inputs, tmp_path / "b", "--mode", "head", "--group-sizes", "2,4", "--seed", "7")
    c = run(inputs, tmp_path / "c", "--mode", "head", "--group-sizes", "2,4", "--seed", "8")
    assert a.exit_code == b.exit_code == c.exit_code == 0
    ta, tb, tc = (pd.read_csv(tmp_path / d / "variance.csv") for d in "abc")
    pd.testing.assert_frame_equal(ta, tb)
    assert not np.allclose(ta["variance"], tc["variance"])


def test_bad_mode_is_a_clear_error(inputs, tmp_path: Path) -> None:
    result = run(inputs, tmp_path / "o", "--mode", "exact")
    assert result.exit_code == 2
    assert "field 'mode'" in result.stderr and "proxy, head, full" in result.stderr


def test_rloo_and_none_are_unbiased_on_the_embedded_default() -> None:
    """The issue's check on real data: rloo's (and trivially none's) |bias_z| stays small."""
    from otb_diag.io.batches import checkpoint_batch
    from otb_diag.io.loading import LoadOptions, load_rollouts
    from otb_diag.io.scenarios import DEFAULT_ROLLOUTS, default_checkpoint
    from otb_diag.maths.returns import returns_to_go
    from otb_diag.maths.variance.paired_draws import BaselineSpec, empirical_variance
    from otb_diag.policy.scores.token_scores import token_scores

    ckpt, batch, _ = checkpoint_batch(
        default_checkpoint(), load_rollouts(DEFAULT_ROLLOUTS), LoadOptions()
    )
    scores = token_scores(ckpt.model, batch, "head", k=64, seed=0)
    specs = [BaselineSpec(b, b, None) for b in ("none", "mean", "rloo")]
    table, _ = empirical_variance(
        returns_to_go(batch.token_rewards, batch.mask), batch.mask, batch.group, scores.proj,
        {"proxy": scores.sq_norm}, specs=specs, aggregations=("token-sum",),
        group_sizes=(2, 4, 8), draws=100, bootstrap=100, seed=0,
    )  # fmt: skip
    by = table.set_index(["baseline", "group_size"])["bias_z"]
    assert (by.loc["none"] == 0).all()
    assert (by.loc["rloo"] < 3).all(), by.loc["rloo"]
    # the group mean includes each response's own reward: its gradient is shrunk, and flagged
    assert by.loc[("mean", 2)] > 3


def claim_row(n: int, equiv: float, where: str) -> HeadlineRow:
    return HeadlineRow(mode="head", aggregation="token-sum", group_size=n, otb_ratio_to_mean=0.5,
                       otb_ratio_to_rloo=None, equivalent_mean_group_size=equiv,
                       equivalent_range=where, token_savings=1 - n / equiv)  # fmt: skip


PAPER_READING = (
    "the paper reports > 65 % fewer tokens at equal score over training, a different quantity"
)


def test_paper_claim_gives_both_readings_each_named() -> None:
    """Planted headline rows: N′ = 10.8 at N = 4 is a 63 % saving at equal variance, beside
    the paper's > 65 % at equal score (another quantity), and N = 4 ≈ N = 32 not reproduced."""
    from otb_diag.pipelines.variance.conclusions import paper_claim

    [v] = paper_claim([claim_row(2, 3.0, "within"), claim_row(4, 10.8, "within")], 16)
    assert (v.mode, v.verdict, v.equivalent_mean_group_size) == ("head", "not reproduced", 10.8)
    assert v.token_savings == pytest.approx(1 - 4 / 10.8) and f"{v.token_savings:.0%}" == "63%"
    assert v.text == (
        "at equal gradient variance, OTB at N = 4 matches mean at N′ = 10.8 (63 % fewer sampled "
        f"tokens; {PAPER_READING}); N = 4 ≈ N = 32 at equal variance: not reproduced"
    )
    assert "8×" not in v.text


def test_paper_claim_reproduced_and_undecided() -> None:
    from otb_diag.pipelines.variance.conclusions import paper_claim

    # N′ = 40 measured: a 90 % saving at equal variance, N = 4 ≈ N = 32 reproduced
    [v] = paper_claim([claim_row(4, 40.0, "within")], 64)
    assert v.verdict == "reproduced" and v.token_savings == pytest.approx(0.9)
    assert v.text == (
        "at equal gradient variance, OTB at N = 4 matches mean at N′ = 40.0 (90 % fewer sampled "
        f"tokens; {PAPER_READING}); N = 4 ≈ N = 32 at equal variance: reproduced"
    )
    # beyond the measured range: undecided when the largest N is below 32, else reproduced;
    # the saving is then a lower bound, 1 − 4/max N
    beyond = replace(claim_row(4, math.inf, "beyond"), token_savings=1 - 4 / 16)
    [v] = paper_claim([beyond], 16)
    assert v.verdict == "undecided" and math.isinf(v.equivalent_mean_group_size)
    assert v.text == (
        "at equal gradient variance, OTB at N = 4 matches mean at N′ > 16 (at least 75 % fewer "
        f"sampled tokens; {PAPER_READING}); N = 4 ≈ N = 32 at equal variance: undecided "
        "(N′ = 32 needs N = 32 measured, pools of M ≥ 64)"
    )
    assert paper_claim([claim_row(4, math.inf, "beyond")], 32)[0].verdict == "reproduced"
    # below the measured range: N′ ≤ min N, an upper bound on the saving (here negative)
    [v] = paper_claim([claim_row(4, 2.0, "below")], 16)
    assert v.verdict == "not reproduced"
    assert "matches mean at N′ ≤ 2.0 (at least 100 % more sampled tokens;" in v.text
    assert paper_claim([claim_row(8, 40.0, "within")], 64) == []  # no N = 4, no verdict


BLOCK_COLUMNS = ["block", *COLUMNS, "draws", "groups", "constant_groups", "equivalent_range"]


@pytest.mark.slow  # runs a command end to end (a real run: seconds)
def test_full_mode_by_block_in_forward_mode(inputs, tmp_path: Path) -> None:
    """`--by-block --engine jvp`: variance_blocks.csv (columns as documented; blocks sum to the
    total), a fidelity row per block, and the summary's account of the engine and its error."""
    out = tmp_path / "o"
    result = run(inputs, out, "--mode", "full", "--group-sizes", "2,4", "--by-block",
                 "--engine", "jvp", "--directions-per-block", "4")  # fmt: skip
    assert result.exit_code == 0, result.output
    blocks = pd.read_csv(out / "variance_blocks.csv")
    assert list(blocks.columns) == BLOCK_COLUMNS
    assert list(blocks["block"].unique()) == ["embeddings", "layer.0", "final_norm", "head"]
    total = pd.read_csv(out / "variance.csv").set_index(["aggregation", "baseline", "group_size"])
    summed = blocks.groupby(["aggregation", "baseline", "group_size"])["variance"].sum()
    np.testing.assert_allclose(summed.loc[total.index], total["variance"], rtol=1e-9)
    fid = pd.read_csv(out / "fidelity.csv")
    assert list(fid["block"]) == ["all", "embeddings", "layer.0", "final_norm", "head"]
    summary = json.loads((out / "summary.json").read_text())
    [full] = summary["full"].values()
    assert full["engine"] == "jvp" and full["sq_norm"].startswith("JL estimate")
    assert full["sequence_sq_norm"].startswith("JL estimate ‖Σ_t u_t‖²")  # no exact part here
    assert full["jl_error"]["k"] == 16 and full["jl_error"]["subsketches"] == 2
    assert (out / "variance_by_block.png").exists()
    assert "engine jvp" in result.stdout and "projection error (k=16" in result.stdout


def test_full_mode_over_budget_is_refused(inputs, tmp_path: Path) -> None:
    result = run(inputs, tmp_path / "o", "--mode", "full", "--budget", "0.000001s")
    assert result.exit_code == 2
    assert "exceeds the budget" in result.stderr and "--force" in result.stderr
    assert not (tmp_path / "o" / "variance.csv").exists()
    bad = run(inputs, tmp_path / "p", "--mode", "full", "--budget", "soon")
    assert bad.exit_code == 2 and "field 'budget'" in bad.stderr


@pytest.mark.slow  # runs a command end to end (a real run: seconds)
def test_a_step_range_of_a_dump_directory(inputs, tmp_path: Path) -> None:
    """`--rollouts DIR --steps A-B` (verl's rollout_data_dir, one file per step): only the pools
    of those steps are measured; group ids repeated across files stay apart."""
    ckpt, pool = inputs
    rows = [json.loads(line) for line in pool.read_text().splitlines()]
    dump = tmp_path / "rollout_data"
    dump.mkdir()
    for step in (1, 2):  # the same 3 group ids in each step's file
        (dump / f"{step}.jsonl").write_text(
            "".join(json.dumps({**r, "step": step}) + "\n" for r in rows)
        )
    counts = {}
    for steps in (None, "2-2"):
        out = tmp_path / f"out-{steps}"
        extra = ("--steps", steps) if steps else ()
        result = run((ckpt, dump), out, "--mode", "proxy", "--group-sizes", "2", *extra)
        assert result.exit_code == 0, result.output
        counts[steps] = int(pd.read_csv(out / "variance.csv")["groups"].iloc[0])
    assert counts == {None: 6 * 20, "2-2": 3 * 20}  # groups drawn: pools × --draws 20
