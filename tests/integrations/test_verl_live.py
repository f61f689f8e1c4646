"""`compute_otb_metrics` and `dump_batch` on verl-shaped batches (verl is not installed: its
`DataProto` is stood in for by an object with `.batch`, `.non_tensor_batch`, `.meta_info`).
The metrics equal `otb-diag energy --model-free` on the dumped batch, and OTB advantages made
by verl's function (the project's `verl_otb_advantage`, equal to verl's to the last bit, as
tests/maths/estimators show) audit clean, while perturbed ones do not; the within/between split
from given scores is that of verl's own advantages, with importance weights that of
variance-compare's draws, and 0 under OTB at a step whose groups all have equal rewards."""

from __future__ import annotations

import json
import os
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from otb_diag.cli.main import app
from typer.testing import CliRunner

from otb_diag import api
from otb_diag.errors import InputError
from otb_diag.integrations.core.collapse_watch import CollapseWatch
from otb_diag.integrations.core.step_metrics import SPLIT_MODE, split_metrics
from otb_diag.integrations.core.worker import Worker
from otb_diag.integrations.verl.adapter import (
    BudgetTracker,
    compute_otb_metrics,
    dump_batch,
    verl_batch,
)
from otb_diag.io.scenarios import default_checkpoint
from otb_diag.maths.energy.token_stats import logged_stats, stats_from_logits
from otb_diag.maths.estimators.advantages import Estimator
from otb_diag.maths.estimators.otb import verl_otb_advantage
from otb_diag.maths.noise.budget_stream import ONE_STEP_NOISE_SCALE, BudgetPools
from otb_diag.maths.noise.step_split import SPLIT_SEED, step_split
from otb_diag.maths.returns import group_index, returns_to_go
from otb_diag.maths.variance.paired_draws import (
    BaselineSpec,
    draw_estimates,
    pool_rows,
    pool_score_means,
)
from otb_diag.policy.scores.token_scores import token_scores

runner = CliRunner()
GROUPS, N, T, P, V = 3, 4, 7, 3, 11


def verl_shaped(seed: int = 0) -> dict:
    """A batch as verl's trainer holds it after `compute_advantage` with
    `adv_estimator=optimal_token_baseline`: right-padded responses, left-padded prompts,
    rewards on the last response token, groups by `uid` (rows of a group not adjacent)."""
    g = torch.Generator().manual_seed(seed)
    b = GROUPS * N
    lengths = torch.randint(2, T + 1, (b,), generator=g)
    response_mask = (torch.arange(T)[None, :] < lengths[:, None]).float()
    responses = torch.randint(3, V, (b, T), generator=g) * response_mask.long()
    stats = stats_from_logits(3 * torch.randn(b, T, V, generator=g), responses)
    last = lengths - 1
    token_level_rewards = torch.zeros(b, T)
    token_level_rewards[torch.arange(b), last] = torch.randint(0, 2, (b,), generator=g).float()
    uid = np.array([f"prompt-{i % GROUPS}" for i in range(b)], dtype=object)
    prompt_lengths = torch.randint(1, P + 1, (b,), generator=g)
    prompt_mask = (torch.arange(P)[None, :] >= P - prompt_lengths[:, None]).long()
    prompts = torch.randint(3, V, (b, P), generator=g) * prompt_mask
    index = group_index(list(uid))
    advantages, _ = verl_otb_advantage(
        token_level_rewards, response_mask, index, stats.logprob, stats.sum_pi2
    )
    return {
        "responses": responses,
        "response_mask": response_mask,
        "attention_mask": torch.cat([prompt_mask, response_mask.long()], dim=1),
        "prompts": prompts,
        "old_log_probs": stats.logprob * response_mask,
        "sum_pi_squared": stats.sum_pi2 * response_mask,
        "token_level_rewards": token_level_rewards,
        "advantages": advantages,
        "uid": uid,
    }


def data_proto(fields: dict) -> SimpleNamespace:
    tensors = {k: v for k, v in fields.items() if isinstance(v, torch.Tensor)}
    return SimpleNamespace(
        batch=tensors, non_tensor_batch={"uid": fields["uid"]}, meta_info={"temperature": 1.0}
    )


@pytest.mark.slow  # runs a command end to end (a real run: seconds)
def test_metrics_equal_energy_on_the_dumped_batch(tmp_path: Path) -> None:
    fields = verl_shaped()
    metrics = compute_otb_metrics(data_proto(fields), adv_estimator="optimal_token_baseline")
    assert metrics == compute_otb_metrics(fields, adv_estimator="optimal_token_baseline")
    path = dump_batch(data_proto(fields), tmp_path / "dumps", step=7)
    assert path.name == "step_000007.jsonl"
    out = tmp_path / "energy"
    args = ["energy", "--model-free", "--rollouts", str(path), "--out", str(out), "--quiet"]
    result = runner.invoke(app, [*args, "--trainer-baseline", "optimal_token_baseline"])
    assert result.exit_code == 0, result.output
    summary = json.loads((out / "summary.json").read_text())
    assert summary["energy"]["sequence_energy_mean"] == pytest.approx(
        metrics["otb/energy/sequence_mean"], rel=1e-6
    )
    assert summary["energy"]["group_energy_cv_median"] == pytest.approx(
        metrics["otb/energy/group_cv_median"], rel=1e-6
    )
    for baseline, proxies in summary["proxies"].items():
        for name in ("proxy2_total_power", "token_total_power", "expected_a_squared"):
            key = f"otb/proxy/{baseline}/{name}"
            assert proxies[name] == pytest.approx(metrics[key], rel=1e-6, abs=1e-12), key
    audit = summary["advantage_audit"]
    assert audit["agrees"] and audit["max_abs_diff"] == metrics["otb/audit/max_abs_diff"]


def test_dump_reads_back_as_the_same_batch(tmp_path: Path) -> None:
    """Every tensor the metrics use comes back bit for bit from the dumped rows."""
    fields = verl_shaped(seed=1)
    fields["rollout_is_weights"] = 0.5 + torch.rand(
        GROUPS * N, T, generator=torch.Generator().manual_seed(2)
    )
    live = verl_batch(fields, step=3)
    back = api.response_batch(api.read_rollouts(dump_batch(fields, tmp_path, step=3)))
    assert back.group_names == live.group_names
    for name in ("group", "sample", "length", "response_ids", "valid", "mask", "token_rewards",
                 "reward", "temperature", "is_weights", "logprobs", "sum_pi2",
                 "trainer_advantage"):  # fmt: skip
        assert torch.equal(getattr(back, name), getattr(live, name)), name
    assert back.prompt_ids == live.prompt_ids


def test_verl_otb_advantages_audit_clean_and_others_do_not() -> None:
    fields = verl_shaped(seed=3)
    clean = compute_otb_metrics(fields, adv_estimator="optimal_token_baseline")
    assert clean["otb/audit/agrees"] == 1.0
    assert clean["otb/audit/max_abs_diff"] <= 1e-6
    # OTB's advantages are not RLOO's: the same batch audited as RLOO fails.
    wrong = compute_otb_metrics(fields, adv_estimator="rloo")
    assert wrong["otb/audit/agrees"] == 0.0
    fields["advantages"] = fields["advantages"] * 1.01
    assert compute_otb_metrics(fields, adv_estimator="otb")["otb/audit/agrees"] == 0.0
    assert "otb/audit/agrees" not in compute_otb_metrics(fields, adv_estimator=None)


def test_bad_batches_get_one_clear_message() -> None:
    fields = verl_shaped()
    with pytest.raises(InputError, match="no sum_pi_squared .*calculate_sum_pi_squared=true"):
        compute_otb_metrics({k: v for k, v in fields.items() if k != "sum_pi_squared"})
    split = dict(fields, uid=np.array([*fields["uid"][:-1], "lonely"], dtype=object))
    with pytest.raises(InputError, match="groups are not whole: group 'lonely' has 1"):
        compute_otb_metrics(split)
    with pytest.raises(InputError, match="takes a verl DataProto or a dict"):
        compute_otb_metrics([1, 2, 3])
    with pytest.raises(InputError, match=r"scores must be \[B, T, k\] over the batch's 12"):
        compute_otb_metrics(fields, scores=torch.zeros(GROUPS * N - 1, T, 4))


@pytest.mark.slow  # runs a command end to end (a real run: seconds)
@pytest.mark.renders  # reads the rendered figures
def test_dynamics_reads_otb_metrics_from_a_verl_metric_file(tmp_path: Path) -> None:
    """verl's file logger writes `{"step": n, "data": {...}}` lines; the `otb/` metrics logged
    beside its own come through `dynamics` as columns, a figure and the last values."""
    lines = []
    for step in range(1, 4):
        metrics = compute_otb_metrics(verl_shaped(seed=step), adv_estimator="otb")
        data = {"actor/grad_norm": 1.0 + step, "critic/score/mean": 0.1 * step, **metrics}
        lines.append(json.dumps({"step": step, "data": data}))
    run, out = dynamics_of(lines, tmp_path)
    assert run["source"] == "verl"
    assert run["otb"] == {k: v for k, v in metrics.items() if np.isfinite(v)}
    assert (out / "fig_live_otb.png").stat().st_size > 0


def with_rho(fields: dict, seed: int) -> dict:
    """`fields` with truncated importance weights ρ in [0.2, 2] and verl's OTB advantages made
    with them (`w ρ²` before accumulating), as verl's `compute_advantage` hands them over."""
    rho = 0.2 + 1.8 * torch.rand(GROUPS * N, T, generator=torch.Generator().manual_seed(seed))
    advantages, _ = verl_otb_advantage(
        fields["token_level_rewards"], fields["response_mask"], group_index(list(fields["uid"])),
        fields["old_log_probs"], fields["sum_pi_squared"], rollout_is_weights=rho,
    )  # fmt: skip
    return {**fields, "rollout_is_weights": rho, "advantages": advantages}


@pytest.mark.parametrize("importance_weights", [False, True])
def test_the_split_from_scores_is_that_of_verls_own_advantages(importance_weights: bool) -> None:
    """`otb/split/otb/...` from given scores equals the split of the contributions formed by
    hand from the batch's verl OTB advantages (with the batch's ρ when it has them) under verl's
    default token-mean: `x_i = B · Σ_t (mask_t / Σ mask) A_t s_t`."""
    fields = verl_shaped(seed=4)
    if importance_weights:
        fields = with_rho(fields, seed=8)
    scores = torch.randn(GROUPS * N, T, 5, generator=torch.Generator().manual_seed(5))
    metrics = compute_otb_metrics(fields, adv_estimator="optimal_token_baseline", scores=scores)
    mask, advantages = fields["response_mask"].double(), fields["advantages"].double()
    x = GROUPS * N / mask.sum() * torch.einsum("bt,btk->bk", mask * advantages, scores.double())
    by_hand = step_split(x, group_index(list(fields["uid"])))
    for name, value in by_hand.items():
        assert metrics[f"otb/split/otb/{name}"] == pytest.approx(value, rel=1e-5), name
    assert "otb/split/otb/within" not in compute_otb_metrics(fields)  # no scores, no split


def test_importance_weights_reach_the_split_as_they_reach_variance_compare() -> None:
    """With ρ ≠ 1 the split's prompt estimates `ĝ_p` are those of variance-compare's draws
    (`draw_estimates`, one draw of every prompt's whole pool, the same estimator, ρ and
    aggregation): its `total` (S_m) and `|G|²` come out of `ĝ_p` alone. ρ changes OTB's split
    (its baseline weights `w ρ²`) and not `mean`'s (no factor ρ on a token's term)."""
    fields = with_rho(verl_shaped(seed=9), seed=10)
    batch = verl_batch(fields)
    scores = torch.randn(GROUPS * N, T, 4, generator=torch.Generator().manual_seed(11))
    baselines = {"otb": {}, "mean": {}}
    split = split_metrics(batch, scores, baselines, "token-mean")
    on_policy = split_metrics(replace(batch, is_weights=None), scores, baselines, "token-mean")
    assert split["otb/split/otb/within"] != pytest.approx(on_policy["otb/split/otb/within"])
    assert split["otb/split/mean/within"] == on_policy["otb/split/mean/within"]
    returns = returns_to_go(batch.token_rewards, batch.mask)
    rows = np.stack(pool_rows(batch.group))[None]  # [1, P, N]: each prompt's whole pool
    draws = draw_estimates(
        returns, batch.mask, scores, {"proxy": logged_stats(batch).w}, rows,
        pool_score_means(scores, batch.mask, batch.group),
        [BaselineSpec(b, b, "proxy") for b in baselines], ["token-mean"],
        is_weights=batch.is_weights, estimator=Estimator(tir=False),
    )  # fmt: skip
    for name in baselines:
        g_p = draws["token-mean", name].prompt_sums  # [P, k] ĝ_p of the one draw
        spread = float(np.square(g_p - g_p.mean(0)).sum() / (GROUPS - 1))  # S_m
        grad_sq = float(np.square(g_p.mean(0)).sum()) - spread / GROUPS
        assert split[f"otb/split/{name}/total"] == pytest.approx(spread, rel=1e-5), name
        assert split[f"otb/split/{name}/grad_sq"] == pytest.approx(grad_sq, rel=1e-5), name


def test_equal_rewards_give_otb_no_split_signal() -> None:
    """Every group's rewards equal (0.7, 1.3, 3.0): OTB's float32 advantages are rounding, and
    its split is grpo's exact zeros: 0 terms, undefined ratios. With verl's zero tail a group's
    strictly longest member keeps `A = R` on its tail (`B = 0` there), a real advantage that the
    rounding floor keeps (every group of this batch has a strictly longest member)."""
    fields = verl_shaped(seed=0)
    last = fields["response_mask"].sum(-1).long() - 1
    rewards = torch.zeros(GROUPS * N, T)
    index = group_index(list(fields["uid"]))
    rewards[torch.arange(GROUPS * N), last] = torch.tensor([0.7, 1.3, 3.0])[index]
    raw, _ = verl_otb_advantage(
        rewards, fields["response_mask"], index, fields["old_log_probs"],
        fields["sum_pi_squared"], handle_zero_tail=False,
    )  # fmt: skip
    assert 0 < raw.abs().max() < 1e-6  # rounding, not signal
    batch = verl_batch({**fields, "token_level_rewards": rewards})
    scores = torch.randn(GROUPS * N, T, 5, generator=torch.Generator().manual_seed(5))
    baselines = {"grpo": {}, "otb": {}}
    split = split_metrics(batch, scores, baselines, "token-mean", handle_zero_tail=False)
    for name in ("within", "between", "total", "grad_sq"):
        assert split[f"otb/split/otb/{name}"] == split[f"otb/split/grpo/{name}"] == 0.0, name
    for name in ("within_share", "snr"):
        assert all(np.isnan(split[f"otb/split/{b}/{name}"]) for b in baselines), name
    noise_scales = [split[f"otb/split/{b}/{ONE_STEP_NOISE_SCALE}"] for b in baselines]
    assert noise_scales == [np.inf, np.inf]
    tail = split_metrics(batch, scores, baselines, "token-mean")  # zero tail on
    assert tail["otb/split/otb/within"] > 0 and tail["otb/split/grpo/within"] == 0.0


def test_the_split_from_the_model_scores_it_in_head_mode() -> None:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(default_checkpoint())
    fields = verl_shaped(seed=6)
    scores = token_scores(model, verl_batch(fields), SPLIT_MODE, 16, SPLIT_SEED).proj
    from_model = compute_otb_metrics(fields, adv_estimator="grpo", model=model, split_k=16)
    from_scores = compute_otb_metrics(fields, adv_estimator="grpo", scores=scores)
    assert from_model == from_scores
    assert {k for k in from_model if k.startswith("otb/split/")} >= {
        f"otb/split/{b}/{name}" for b in ("grpo", "otb") for name in ("within", "between")
    }


def test_the_budget_tracker_pools_the_split_across_calls() -> None:
    """`BudgetTracker` called as `compute_otb_metrics` is, over 4 batches with scores: each call
    returns `compute_otb_metrics`' metrics, the collapse watch's (fed the variance proxy and
    the gradient norm given, as TRL's attach feeds it) and the pools fed every split so far
    (`BudgetPools`, fed by hand here); the step's shape is logged beside the split; a call
    without a split adds no budget."""
    tracker, by_hand = BudgetTracker(window=3), BudgetPools("otb/", window=3)
    watch = CollapseWatch()
    for seed in range(4):
        fields = verl_shaped(seed=seed)
        scores = torch.randn(GROUPS * N, T, 5, generator=torch.Generator().manual_seed(seed))
        metrics = compute_otb_metrics(fields, scores=scores)
        assert (metrics["otb/split/prompts"], metrics["otb/split/group_size"]) == (GROUPS, N)
        mean_tokens = float(fields["response_mask"].sum()) / (GROUPS * N)
        assert metrics["otb/split/mean_response_tokens"] == pytest.approx(mean_tokens)
        out = tracker(fields, seed, scores=scores, grad_norm=1.0 + seed)
        watch.add_grad_norm(seed, 1.0 + seed)
        watch.add_variance(seed, metrics["otb/proxy/grpo/proxy2_total_power"])
        metrics |= {f"otb/{k}": v for k, v in watch.metrics().items()}
        expected = metrics | by_hand.update(metrics, seed)
        assert out.keys() == expected.keys() and _nan_equal(out, expected)
    assert list(tracker.core.watch.grad.values) == pytest.approx(np.log([1.0, 2.0, 3.0, 4.0]))
    assert out["otb/budget/grpo/window/steps"] == 3 and out["otb/budget/otb/ema/steps"] == 4
    assert not any(k.startswith("otb/budget/") for k in tracker(verl_shaped(seed=9)))
    few = BudgetTracker(metrics="default")(verl_shaped(seed=1), 1, scores=scores)
    assert 0 < len(few) <= 20 and "otb/budget/grpo/window/resolved" in few


def test_the_budget_tracker_measures_while_the_caller_goes_on() -> None:
    """`submit` reads the batch and hands it to the live core's worker process, which measures
    it while verl's actor update runs; `collect` then gives what one call gives. (That `submit`
    does not wait for the measuring is test_worker.py's.)"""
    fields = verl_shaped(seed=5)
    scores = torch.randn(GROUPS * N, T, 5, generator=torch.Generator().manual_seed(5))
    expected = BudgetTracker()(fields, 1, scores=scores, grad_norm=2.0)
    tracker = BudgetTracker()
    assert tracker.collect() == {}  # nothing submitted
    tracker.submit(fields, 1, scores=scores, grad_norm=2.0)
    worker = tracker.core._worker
    assert isinstance(worker, Worker) and worker.pid != os.getpid()
    out = tracker.collect()
    assert out.keys() == expected.keys() and _nan_equal(out, expected)
    assert tracker.collect() == {}  # collected once


def _nan_equal(a: dict, b: dict) -> bool:
    """Every value of `b` equal in `a`, NaN to NaN (an undefined ratio)."""
    return all(a[k] == b[k] or (np.isnan(a[k]) and np.isnan(b[k])) for k in b)


@pytest.mark.slow  # runs a command end to end (a real run: seconds)
@pytest.mark.renders  # reads the rendered figures
def test_dynamics_pools_the_split_of_a_verl_metric_file_as_the_tracker_did(tmp_path: Path) -> None:
    """A verl file log of 5 steps written from `BudgetTracker` (non-finite values left out, as
    JSON cannot hold them): `dynamics` pools the logged split again and gives the tracker's
    last `otb/budget/...` back to 1e-6."""
    tracker, lines = BudgetTracker(), []
    for step in range(1, 6):
        fields = verl_shaped(seed=20 + step)
        scores = torch.randn(GROUPS * N, T, 5, generator=torch.Generator().manual_seed(step))
        metrics = tracker(fields, step, adv_estimator="grpo", scores=scores)
        data = {"actor/grad_norm": 1.0, "critic/score/mean": 0.1 * step}
        data |= {k: v for k, v in metrics.items() if np.isfinite(v)}
        lines.append(json.dumps({"step": step, "data": data}))
    run, out = dynamics_of(lines, tmp_path)
    assert [b["estimator"] for b in run["budget"]] == ["grpo", "otb"]
    compared = 0
    for pooled in run["budget"]:
        for pool in ("window", "ema"):
            for field, value in pooled[pool].items():
                key = f"otb/budget/{pooled['estimator']}/{pool}/{field}"
                if np.isfinite(metrics[key]):
                    assert value == pytest.approx(metrics[key], rel=1e-6), key
                    compared += 1
    assert compared > 50 and (out / "pooled_noise_scale.png").stat().st_size > 0


def dynamics_of(lines: list[str], tmp_path: Path) -> tuple[dict, Path]:
    """`otb-diag dynamics --json` on a verl file log of `lines`: its one run's record and the
    output folder."""
    log = tmp_path / "metrics.jsonl"
    log.write_text("\n".join(lines) + "\n")
    out = tmp_path / "dynamics"
    result = runner.invoke(app, ["dynamics", "--log", str(log), "--out", str(out), "--json"])
    assert result.exit_code == 0, result.output
    (run,) = json.loads(result.stdout)["runs"]
    return run, out


def test_the_budget_tracker_decides_the_prompts_an_update_takes() -> None:
    """verl's tracker holds the same knee controller as TRL's `attach`: it logs its decision
    and gives it to the caller (docs/live.md says how verl applies it); it needs the prompts a
    step samples, which it decides in multiples of. It applies nothing itself, so the update a
    step trains in is, as far as it knows, the configured batch."""
    with pytest.raises(InputError, match="needs prompts_per_step"):
        BudgetTracker(controller="knee")
    tracker = BudgetTracker(controller="knee", prompts_per_step=GROUPS, metrics="default")
    assert tracker.prompts_per_update is None  # nothing seen yet
    scores = torch.randn(GROUPS * N, T, 5, generator=torch.Generator().manual_seed(3))
    out = tracker(verl_shaped(seed=3), 1, scores=scores)
    assert out["otb/controller/decided_prompts"] == GROUPS == tracker.prompts_per_update
    assert out["otb/controller/prompts_per_update"] == GROUPS
    assert tracker.core.controller.rule.most == 8 * GROUPS
