"""`otb-diag variance-compare` end to end on a tiny real checkpoint."""

import json
import math
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
    result = run(inputs, out, "--mode", "proxy,head,full", "--group-sizes", "2,4")
    assert result.exit_code == 0, result.output
    table = pd.read_csv(out / "variance.csv")
    assert list(table.columns[: len(COLUMNS)]) == COLUMNS
    assert set(table["mode"]) == {"proxy", "head", "full"}
    assert sorted(table["group_size"].unique()) == [2, 4]  # at most M/2 = 4 (8 is refused)
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
        assert claim["verdict"] in ("does not hold", "not resolved")
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


def finite_numbers(data) -> bool:
    """Whether every number in parsed JSON is finite (a non-finite one is null or absent)."""
    if isinstance(data, dict):
        return all(finite_numbers(v) for v in data.values())
    if isinstance(data, list):
        return all(finite_numbers(v) for v in data)
    return not isinstance(data, float) or math.isfinite(data)


@pytest.mark.filterwarnings("error::RuntimeWarning")
def test_rewards_without_signal_get_no_verdict(inputs, tmp_path: Path) -> None:
    """Every group's rewards equal: variance-compare says so first, loads no model, writes
    summary.json alone (no NaN in it), every verdict "no signal", and exits 0; report and
    regress read it (its signal counts the one metric), numpy warning nothing."""
    from small_runs import report

    from otb_diag.pipelines.regress.run_metrics import collect_metrics

    ckpt, pool = inputs
    flat = tmp_path / "flat.jsonl"
    rows = [json.loads(line) for line in pool.read_text().splitlines()]
    flat.write_text("".join(json.dumps({**r, "reward": 0.0}) + "\n" for r in rows))
    out = tmp_path / "out"
    result = run((ckpt, flat), out, "--mode", "proxy,head,full")
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith("no signal: each of the 3 groups has equal rewards within it")
    assert sorted(p.name for p in out.iterdir()) == ["summary.json"]
    text = (out / "summary.json").read_text()
    summary = json.loads(text)
    assert "NaN" not in text and "Infinity" not in text and finite_numbers(summary)
    assert summary["signal"] == {"groups": 3, "groups_with_signal": 0}
    assert summary["inputs"]["checkpoints"] == [] and summary["knee"] is None
    assert summary["headline"] == [] and summary["draws"] == {}
    assert [(c["mode"], c["verdict"], c["saving_verdict"]) for c in summary["paper_claim"]] == [
        (m, "no signal", "no signal") for m in ("proxy", "head", "full")
    ]
    assert summary["noise_scale"]["verdict"] == "no signal"
    assert "reproduced" not in text and "not reproduced" not in result.stdout
    metrics = collect_metrics(out)
    assert {k: m.value for k, m in metrics.items()} == {
        "signal/groups": 3.0, "signal/groups_with_signal": 0.0
    }  # fmt: skip
    page = report([out], tmp_path / "report.html")
    said = [v.sentence for v in page.verdicts]
    assert any(s.startswith("No signal: each of the 3 groups") for s in said)
    assert all("reproduced" not in s for s in said)


@pytest.mark.slow  # runs a command end to end (a real run: seconds)
def test_partial_signal_is_said_as_a_share(inputs, tmp_path: Path) -> None:
    """The fixture's pool: 2 of its 3 groups carry a signal (one's rewards are all 1.0)."""
    result = run(inputs, tmp_path / "o", "--mode", "proxy", "--group-sizes", "2,4")
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith(
        "partial signal: 2 of 3 groups (67 %) carry a reward signal; the rest (1) have equal "
        "rewards within their group"
    )
    summary = json.loads((tmp_path / "o" / "summary.json").read_text())
    assert summary["signal"] == {"groups": 3, "groups_with_signal": 2}


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


End = tuple[float, str]  # an end of N′'s interval: its value and where it lies


def claim_row(
    n: int,
    equiv: float,
    where: str = "within",
    low: End | None = None,
    high: End | None = None,
    sizes: tuple[int, int] = (2, 16),
) -> HeadlineRow:
    """A hand-built headline row at N = n: N′ (`where` it lies) with its interval's ends
    (default: N′ itself), the savings `1 − n/N′` at each (a bound at the smallest or largest N
    measured, `sizes`, where N′ is below or beyond them)."""
    low, high = low or (equiv, where), high or (equiv, where)

    def saving(value: float, at: str) -> float:
        return 1 - n / {"within": value, "below": sizes[0], "beyond": sizes[1]}[at]

    return HeadlineRow(
        mode="head", aggregation="token-sum", group_size=n, otb_ratio_to_mean=0.5,
        otb_ratio_to_mean_low=0.4, otb_ratio_to_mean_high=0.6, otb_ratio_to_rloo=None,
        equivalent_mean_group_size=equiv, equivalent_range=where,
        equivalent_low=low[0], equivalent_low_range=low[1],
        equivalent_high=high[0], equivalent_high_range=high[1],
        token_savings=saving(equiv, where), token_savings_low=saving(*low),
        token_savings_high=saving(*high), otb_below_mean="holds",
    )  # fmt: skip


PAPER_READING = "the paper's > 65 % is at equal score over training, a different quantity"


def test_the_embedded_defaults_head_claim_is_not_resolved() -> None:
    """The embedded default's head mode, as measured (N′ = 10.4, its interval from at most the
    smallest N measured to beyond the largest, pools of 32 showing N′ up to 16): both readings
    not resolved, the sentence giving both intervals and why."""
    from otb_diag.pipelines.variance.conclusions import paper_claim

    row = claim_row(4, 10.4, low=(2.0, "below"), high=(math.inf, "beyond"))
    [v] = paper_claim([claim_row(2, 8.7), row], ["head"], 16)
    assert (v.mode, v.saving_verdict, v.verdict) == ("head", "not resolved", "not resolved")
    assert (v.equivalent_low, v.equivalent_high_range) == (2.0, "beyond")
    assert (v.token_savings_low, v.token_savings_high) == (-1.0, 0.75)
    assert v.text == (
        "at equal gradient variance, OTB at N = 4 matches mean at N′ = 10.4 (95 % interval ≤ 2.0 "
        "to ∞, its upper end past N = 16, the largest N measured), 62 % fewer sampled tokens "
        "(95 % interval ≤ −100 % to 100 %); > 65 % fewer "
        "tokens at equal variance: not resolved (the interval reaches 65 %; "
        f"{PAPER_READING}); N = 4 ≈ N = 32 at equal variance: not resolved (N′ up to 16 can be "
        "measured here; N′ ≥ 32 needs N = 32 measured, pools of M ≥ 64)"
    )
    assert "8×" not in v.text and "reproduced" not in v.text


def test_an_interval_below_the_claim_does_not_hold() -> None:
    """N′ = 8.9 within 5.9–11.7 (measured up to 16): N′ ≥ 32 excluded, does not hold; the saving
    interval (32 % to 66 %) reaches 65 %: not resolved; below 65 % altogether: does not hold."""
    from otb_diag.pipelines.variance.conclusions import claim_verdict

    v = claim_verdict("head", claim_row(4, 8.9, low=(5.9, "within"), high=(11.7, "within")), 16)
    assert (v.saving_verdict, v.verdict) == ("not resolved", "does not hold")
    assert v.text.startswith(
        "at equal gradient variance, OTB at N = 4 matches mean at N′ = 8.9 (95 % interval 5.9 to "
        "11.7), 55 % fewer sampled tokens (95 % interval 32 % to 65 %);"
    )
    assert v.text.endswith("N = 4 ≈ N = 32 at equal variance: does not hold (the interval lies "
                           "below N′ = 32)")  # fmt: skip
    v = claim_verdict("head", claim_row(4, 8.0, low=(5.0, "within"), high=(11.0, "within")), 16)
    assert (v.saving_verdict, v.verdict) == ("does not hold", "does not hold")
    assert "> 65 % fewer tokens at equal variance: does not hold (the interval lies below 65 %;" \
        in v.text  # fmt: skip
    # an end at most the smallest N (the mean curve already lower there) is below 32 too
    v = claim_verdict("head", claim_row(4, 2.0, "below", high=(3.0, "within")), 16)
    assert v.verdict == "does not hold" and "matches mean at N′ ≤ 2.0 (95 % interval ≤ 2.0" \
        in v.text and "at least 100 % more sampled tokens" in v.text  # fmt: skip


def test_an_interval_above_the_claim_holds() -> None:
    """N′ = 40 within 34–50 (measured up to 64): both readings hold; beyond the largest N the
    interval's low end says only N′ > max N, which holds at max N ≥ 32."""
    from otb_diag.pipelines.variance.conclusions import claim_verdict

    row = claim_row(4, 40.0, low=(34.0, "within"), high=(50.0, "within"), sizes=(2, 64))
    v = claim_verdict("full", row, 64)
    assert (v.mode, v.saving_verdict, v.verdict) == ("full", "holds", "holds")
    assert v.text.endswith("N = 4 ≈ N = 32 at equal variance: holds (the interval lies at or "
                           "above N′ = 32)")  # fmt: skip
    assert "(95 % interval 34.0 to 50.0), 90 % fewer sampled tokens (95 % interval 88 % to " \
        "92 %)" in v.text  # fmt: skip
    beyond = claim_row(4, math.inf, "beyond", sizes=(2, 64))
    v = claim_verdict("full", beyond, 64)
    assert v.verdict == "holds" and "matches mean at N′ > 64 (95 % interval > 64 to ∞, its" \
        in v.text and "at least 94 % fewer sampled tokens" in v.text  # fmt: skip


def test_an_interval_reaching_the_claim_is_not_resolved() -> None:
    """An interval across N′ = 32 (measured up to 64) says neither; an interval wholly beyond
    a largest N of 16 cannot show N′ ≥ 32: not resolved either, saying why."""
    from otb_diag.pipelines.variance.conclusions import claim_verdict

    row = claim_row(4, 30.0, low=(20.0, "within"), high=(40.0, "within"), sizes=(2, 64))
    v = claim_verdict("head", row, 64)
    assert (v.saving_verdict, v.verdict) == ("holds", "not resolved")
    assert v.text.endswith("at equal variance: not resolved (the interval reaches N′ = 32)")
    v = claim_verdict("head", claim_row(4, math.inf, "beyond"), 16)
    assert (v.saving_verdict, v.verdict) == ("holds", "not resolved")
    assert "(N′ up to 16 can be measured here; N′ ≥ 32 needs N = 32 measured" in v.text


def test_no_signal_and_no_claim_n() -> None:
    """A mode with no headline row (the mean baseline's variance not above 0) reads "no
    signal" in both readings, with no number; without N = 4 measured there is no verdict."""
    from otb_diag.pipelines.variance.conclusions import paper_claim

    proxy, head = paper_claim([claim_row(4, 10.0)], ["proxy", "head"], 16)
    assert (proxy.mode, proxy.saving_verdict, proxy.verdict) == ("proxy", "no signal", "no signal")
    assert proxy.equivalent_mean_group_size is None and proxy.token_savings is None
    assert "no N′ and no saving" in proxy.text and "reproduced" not in proxy.text
    assert head.verdict == "does not hold"  # N′ = 10 measured, an interval of one point
    assert paper_claim([claim_row(8, 40.0)], ["head"], 64) == []  # no N = 4, no verdict
    [none] = paper_claim([], ["head"], 16)
    assert none.verdict == "no signal"


def variance_rows(otb: tuple[float, float, float]) -> pd.DataFrame:
    """variance.csv's rows of one mode, hand-built: mean's variance 1.0 then 0.5 at N = 2, 4 with
    tight intervals, OTB's (variance, low, high) at both N."""
    from otb_diag.maths.variance.intervals import compare_to_mean

    rows = [("mean", 2, (1.0, 0.98, 1.02)), ("mean", 4, (0.5, 0.49, 0.51)),
            ("otb", 2, otb), ("otb", 4, otb)]  # fmt: skip
    table = pd.DataFrame(
        [{"aggregation": "token-sum", "baseline": b, "group_size": n, "variance": v,
          "ci_low": lo, "ci_high": hi} for b, n, (v, lo, hi) in rows]
    )  # fmt: skip
    return compare_to_mean(table, [2, 4]).assign(mode="full")


@pytest.mark.parametrize(
    ("otb", "verdict"),
    [((0.2, 0.18, 0.22), "holds"), ((0.5, 0.3, 0.7), "not resolved"),
     ((0.8, 0.7, 0.9), "does not hold")],
)  # fmt: skip
def test_otb_below_mean_is_read_off_the_ratios_interval(otb, verdict: str) -> None:
    """OTB/mean's interval (the corners of both variances' intervals, the projection's widening
    negligible at k = 10⁶) below 1: holds; across 1: not resolved; above: does not hold."""
    from otb_diag.pipelines.variance.conclusions import headline

    _, at_4 = headline(variance_rows(otb), 1_000_000)
    assert at_4.group_size == 4 and at_4.otb_below_mean == verdict
    assert at_4.otb_ratio_to_mean == pytest.approx(otb[0] / 0.5)
    assert at_4.otb_ratio_to_mean_low == pytest.approx(otb[1] / 0.51, rel=0.01)
    assert at_4.otb_ratio_to_mean_high == pytest.approx(otb[2] / 0.49, rel=0.01)


def test_a_mode_without_positive_variance_has_no_headline_row() -> None:
    from otb_diag.pipelines.variance.conclusions import headline

    flat = variance_rows((0.2, 0.18, 0.22)).assign(variance=0.0, ci_low=0.0, ci_high=0.0)
    assert headline(flat, 64) == []


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
