"""`attach` on a real TRL `GRPOTrainer` (CPU, embedded checkpoint): the `otb/` metrics reach
`trainer_state.json` at every step, `otb-diag energy` on a dumped step gives them back
(model-free to 1e-6, with the checkpoint of that step to 1e-4), TRL's advantages pass the
audit, the within/between split logged at every second step (its scores from the loss's own
forward: the extra forward is made to fail) equals the split of the dumped step
scored offline by that step's checkpoint, the training's numbers are those of a run without
`attach`, and bad input gets one clear message before anything changes. A real `RLOOTrainer`
is audited against the registry's `rloo`; the extra forward reproduces energy's; failures with
several processes (a failed gather, another process's error, the main one's, a process whose
batch failed before its micro-steps, a dump directory given elsewhere) are checked at the
function level (tests/integrations/test_trl_processes.py runs 2 processes for real)."""

from __future__ import annotations

import json
import math
import re
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
import torch
from otb_diag.cli.main import app
from trl_toy import GENERATIONS, toy_trainer
from typer.testing import CliRunner
from unwritten_figures import unwritten_figures

from otb_diag.errors import InputError
from otb_diag.integrations.core import live_core
from otb_diag.integrations.core.live_core import Share
from otb_diag.integrations.core.step_metrics import SPLIT_MODE, split_metrics
from otb_diag.integrations.trl import adapter as trl_integration
from otb_diag.integrations.trl import attach
from otb_diag.integrations.trl.support import LOSS_AGGREGATION
from otb_diag.io.loading import load_rollouts
from otb_diag.io.rollouts.to_batch import make_batch
from otb_diag.io.scenarios import default_checkpoint
from otb_diag.maths.estimators.registry import trainer_baseline
from otb_diag.maths.noise.step_split import SPLIT, SPLIT_SEED
from otb_diag.policy.scores.token_scores import token_scores
from otb_diag.runtime.torchrun import Dist

pytestmark = pytest.mark.external  # runs TRL
runner = CliRunner()
STEPS = 3
SPLIT_EVERY, SPLIT_K = 2, 16  # the split at steps 1 and 3


@pytest.fixture(scope="module")
def live_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, torch.Tensor]]:
    """3 steps with `attach(dump_dir=..., split_every=2)`, a checkpoint after each; and the
    final weights."""
    out = tmp_path_factory.mktemp("trl-live") / "grpo-toy"
    trainer = toy_trainer(out, STEPS, save_strategy="steps", save_steps=1, save_only_model=True)
    attach(trainer, dump_dir=out / "otb", split_every=SPLIT_EVERY, split_k=SPLIT_K, metrics="all")
    with pytest.MonkeyPatch.context() as patch:  # the split's scores come from the loss forward
        patch.setattr(trl_integration, "split_scores", no_extra_forward)
        trainer.train()
    return out, {k: v.detach().clone() for k, v in trainer.model.state_dict().items()}


def no_extra_forward(*_: object) -> None:
    """In place of the extra forward of the split: fails, so a split step that took that route
    would switch the diagnostics off and log no split."""
    raise AssertionError("the split ran an extra forward")


def logged(out: Path) -> list[dict[str, float]]:
    state = json.loads((out / f"checkpoint-{STEPS}" / "trainer_state.json").read_text())
    return [e for e in state["log_history"] if "grad_norm" in e]


def energy(rollouts: Path, out: Path, *extra: str) -> dict:
    """`otb-diag energy` on `rollouts`: its summary (figures not rendered: numbers are read)."""
    args = ["energy", "--rollouts", str(rollouts), "--out", str(out), "--quiet", *extra]
    with unwritten_figures():
        result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    return json.loads((out / "summary.json").read_text())


# A token's w = 1 − 2p + Σπ², from float32 log p and Σπ² (what the loss's forward gives and a
# rollout file holds), is known to a few float32 ulps at 1: p and Σπ² are each rounded, and log p
# comes from a float32 log-sum-exp over logits of magnitude ~10, whose reduction order moves
# with the thread count. Energy's forward sums (1 − p)² + Σ_{v≠y} π² from the logits instead.
W_FLOOR = 2.0**-19


def close(a: float, b: float, rel: float, scale: float = 0.0, floor: float = 0.0) -> bool:
    """|a − b| ≤ rel · max(|a|, |b|, scale) + floor: `scale` is the magnitude of the quantities
    compared (a proxy that is 0 up to rounding, all rewards of its groups being equal, is
    compared at the scale of the batch's total power), `floor` the float32 resolution of it."""
    return abs(a - b) <= rel * max(abs(a), abs(b), scale) + floor


def check_reproduces(
    summary: dict,
    metrics: dict[str, float],
    rel: float,
    w_floor: float = 0.0,
    token_level_rel: float | None = None,
) -> None:
    """energy's summary against the logged metrics at `rel`, plus what an error of `w_floor`
    on every token's w makes of each (a sequence's W: its tokens times `w_floor`; a proxy: that
    times the largest mean squared advantage); the token-level OTB baselines' proxies at
    `token_level_rel` (default `rel`)."""
    e, totals = summary["energy"], summary["totals"]
    d_energy = w_floor * totals["generated_tokens"] / totals["responses"]
    assert close(e["sequence_energy_mean"], metrics["otb/energy/sequence_mean"], rel, 0, d_energy)
    assert close(e["mean_w"], metrics["otb/energy/mean_w"], rel, 0, w_floor)
    cv_floor = 2 * d_energy / e["sequence_energy_median"]  # CV = sd/mean of W in a group
    assert close(
        e["group_energy_cv_median"], metrics["otb/energy/group_cv_median"], rel, 0, cv_floor
    )
    scale = summary["proxies"]["none"]["token_total_power"]  # E_i[W_i R_i²]
    a_sq = max(p["expected_a_squared"] for p in summary["proxies"].values())
    for baseline, proxies in summary["proxies"].items():
        for name in ("proxy2_total_power", "token_total_power", "expected_a_squared"):
            key = f"otb/proxy/{baseline}/{name}"
            tol = token_level_rel if baseline.startswith("otb") and token_level_rel else rel
            floor = 0.0 if name == "expected_a_squared" else d_energy * a_sq
            assert close(proxies[name], metrics[key], tol, scale, floor), (key, proxies[name])


def test_every_step_logs_otb_metrics(live_run) -> None:
    out, _ = live_run
    entries = logged(out)
    assert [e["step"] for e in entries] == list(range(1, STEPS + 1))
    for e in entries:
        assert e["otb/sum_pi2_from_loss_logits"] == 1.0  # TRL 1.16's fused head gave Σπ²
        assert e["otb/energy/sequence_mean"] > 0
        assert e["otb/audit/agrees"] == 1.0, e["otb/audit/max_abs_diff"]  # TRL's advantages
        assert e["otb/collapse/alarm"] == 0.0
    files = sorted(p.name for p in (out / "otb").iterdir())
    assert files == [f"step_{s:06d}.jsonl" for s in range(1, STEPS + 1)]


def test_model_free_energy_reproduces_the_logged_step(live_run, tmp_path: Path) -> None:
    out, _ = live_run
    for entry in logged(out):
        step = entry["step"]
        summary = energy(
            out / "otb" / f"step_{step:06d}.jsonl", tmp_path / str(step), "--model-free"
        )
        assert summary["totals"]["responses"] == 8
        check_reproduces(summary, entry, rel=1e-6)


def test_energy_with_the_steps_checkpoint_reproduces_it(live_run, tmp_path: Path) -> None:
    """Step s was sampled and trained by the weights after step s − 1 (the embedded checkpoint
    for step 1); energy's own forward agrees with the loss's logits to 1e-4, beyond the float32
    resolution of the logged w (`W_FLOOR`): the toy model's tokens have p up to 0.9998 and w down
    to 4e-8, and a response of 4 such tokens has W ≈ 4e-3.

    Except OTB's token-level baseline, at 1e-2: the logged `w = 1 − 2p + Σπ²` comes from
    float32 `log p` and `Σπ²` (all a rollout file holds), which resolve w only in steps of
    2⁻²⁴ ≈ 6e-8, while energy's forward sums `(1 − p)² + Σ_{v≠y} π²` from the logits without
    cancellation. The toy model's first tokens have p ≈ 0.9996 and w ≈ 2e-7, known to ±30 %;
    OTB's baseline at t = 1 weighs the rewards by exactly those w, and its proxies moved by
    2.7e-3 (relative) on step 3 of this run. `energy --model-free` has the same limit."""
    out, _ = live_run
    for entry in logged(out):
        step = entry["step"]
        ckpt = step_checkpoint(out, step)
        rollouts = out / "otb" / f"step_{step:06d}.jsonl"
        summary = energy(rollouts, tmp_path / str(step), "--ckpt", str(ckpt))
        check_reproduces(summary, entry, rel=1e-4, w_floor=W_FLOOR, token_level_rel=1e-2)


def step_checkpoint(out: Path, step: int) -> Path:
    """The weights that sampled and trained step `step`: those after step − 1."""
    return default_checkpoint() if step == 1 else out / f"checkpoint-{step - 1}"


def test_the_split_is_logged_at_every_second_step(live_run) -> None:
    """At steps 1 and 3, under TRL's own estimator and OTB. A ratio is left out where its
    denominator is 0: at step 1 every group had equal rewards, so `grpo`'s advantages and every
    term were 0. OTB's advantages there are rounding, which the split drops, but on the first
    tokens, where every response was near-certain (Σ W ≈ 1e-4): there verl's ε = 1e-8 moves the
    baseline by 1e-4 of the reward, a real advantage, whose terms are ~1e-12 (docs/live.md)."""
    out, _ = live_run
    split = {e["step"]: e for e in logged(out) if "otb/split/otb/within" in e}
    assert sorted(split) == [1, 3]
    for entry in split.values():
        for baseline in ("grpo", "otb"):
            terms = {k: entry[f"otb/split/{baseline}/{k}"] for k in SPLIT[:4]}
            assert terms["within"] >= 0
            assert terms["total"] == pytest.approx(terms["within"] + terms["between"])
    assert split[1]["otb/split/grpo/grad_sq"] == split[1]["otb/split/grpo/within"] == 0
    assert not {f"otb/split/grpo/{k}" for k in SPLIT[4:]} & set(split[1])  # undefined: left out
    assert 0 < split[1]["otb/split/otb/total"] < 1e-10 < split[3]["otb/split/otb/total"]
    assert split[3]["otb/split/grpo/within"] > 0  # one group of two had mixed rewards
    assert 0 < split[3]["otb/split/grpo/within_share"] < 1


def test_the_split_of_the_dumped_step_equals_the_logged_one(live_run) -> None:
    """The dumped step, read back and scored in head mode by that step's checkpoint, split
    by the same functions under TRL's estimator and loss (dapo: token-mean)."""
    from transformers import AutoModelForCausalLM

    out, _ = live_run
    baselines = {**dict([trainer_baseline("trl")]), "otb": {}}
    for entry in logged(out):
        if "otb/split/otb/within" not in entry:
            continue
        step = entry["step"]
        batch = make_batch(load_rollouts(out / "otb" / f"step_{step:06d}.jsonl"))
        model = AutoModelForCausalLM.from_pretrained(step_checkpoint(out, step))
        scores = token_scores(model, batch, SPLIT_MODE, SPLIT_K, SPLIT_SEED).proj
        offline = split_metrics(batch, scores, baselines, LOSS_AGGREGATION["dapo"])
        assert {k.split("/")[-1] for k in offline if k.count("/") == 3} == set(SPLIT)
        for name, value in offline.items():
            if math.isfinite(value):
                assert entry[name] == pytest.approx(value, rel=1e-6, abs=1e-12), name


def test_dump_directory_reads_as_rollouts(live_run, tmp_path: Path) -> None:
    out, _ = live_run
    result = runner.invoke(app, ["rollouts", "inspect", str(out / "otb"), "--json"])
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert (summary["files"], summary["rows"]) == (STEPS, STEPS * 8)
    assert summary["group_size"]["counts"] == {str(GENERATIONS): STEPS * 8 // GENERATIONS}
    assert summary["steps"] == list(range(1, STEPS + 1))


def test_training_is_untouched(live_run, tmp_path: Path) -> None:
    """The same seed without `attach` ends on the same weights, bit for bit."""
    _, weights = live_run
    plain = toy_trainer(tmp_path / "plain", STEPS)
    plain.train()
    for name, value in plain.model.state_dict().items():
        assert torch.equal(value, weights[name]), name


def recorded_gather(
    monkeypatch: pytest.MonkeyPatch, answer: Callable[[Share], list[Share]]
) -> list[Share]:
    """The core's gather patched: every share this process hands over is kept in the returned
    list, and `answer(share)` is what the gather gives back (the processes' shares in order)."""
    handed: list[Share] = []

    def gather(share: Share, place: Dist) -> list[Share]:
        handed.append(share)
        return answer(share)

    monkeypatch.setattr(live_core, "gather_shares", gather)
    return handed


def planted(monkeypatch: pytest.MonkeyPatch, module: object, name: str, error: Exception) -> None:
    """`module.name` patched to raise `error` whenever it is called; the live core then measures
    in this process (`live_core.MEASURE_IN`), where the patch holds, not in its worker process
    (test_worker.py fails a job there)."""

    def broken(*_: object, **__: object) -> None:
        raise error

    monkeypatch.setattr(module, name, broken)
    monkeypatch.setattr(live_core, "MEASURE_IN", "thread")


def test_an_error_inside_a_hook_switches_off_and_training_goes_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    error = InputError("the step's groups are not whole (simulated)")
    planted(monkeypatch, live_core, "step_and_split_metrics", error)
    trainer = toy_trainer(tmp_path / "run", 2)
    diagnostics = attach(trainer)
    with pytest.warns(RuntimeWarning, match="switched off at step 1: the step's groups"):
        trainer.train()
    assert_trained_without_diagnostics(trainer, diagnostics)


def test_bad_input_is_refused_before_anything_changes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import trl
    from trl import GRPOTrainer

    with pytest.raises(InputError, match="takes a trl.GRPOTrainer or trl.RLOOTrainer; got a dict"):
        attach({})
    trainer = toy_trainer(tmp_path / "run", 1)
    before = dict(vars(trainer))
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    with pytest.raises(InputError, match="dump directory cannot be written"):
        attach(trainer, dump_dir=blocker / "dumps")
    with pytest.raises(InputError, match="every must be a whole number"):
        attach(trainer, every=0)
    with pytest.raises(InputError, match="split_every must be a whole number"):
        attach(trainer, split_every=-1)
    with pytest.raises(InputError, match="split_k must be a whole number"):
        attach(trainer, split_k=0)
    loss_type, trainer.loss_type = trainer.loss_type, "new-loss"
    with pytest.raises(InputError, match="aggregation of TRL's loss_type 'new-loss'"):
        attach(trainer)
    trainer.loss_type = loss_type
    monkeypatch.setattr(trl, "__version__", "0.99.0")
    with pytest.warns(UserWarning, match="tested with TRL 1.16, not 0.99.0"):
        attach(toy_trainer(tmp_path / "other", 1))
    monkeypatch.delattr(GRPOTrainer, "_compute_loss")
    with pytest.raises(InputError, match="has no _compute_loss, the hook"):
        attach(trainer)
    assert vars(trainer).keys() == before.keys()  # no hook installed


@pytest.mark.renders  # reads the rendered figures
def test_dynamics_draws_the_logged_metrics(live_run, tmp_path: Path) -> None:
    out, _ = live_run
    state = out / f"checkpoint-{STEPS}" / "trainer_state.json"
    result = runner.invoke(app, ["dynamics", "--log", str(state), "--out", str(tmp_path), "--json"])
    assert result.exit_code == 0, result.output
    (run,) = json.loads(result.stdout)["runs"]
    last = logged(out)[-1]
    assert run["otb"] == {k: v for k, v in last.items() if k.startswith("otb/")}
    assert run["variance_proxy_kind"] == "proxy2"  # otb/proxy/grpo/proxy2_total_power
    table = pd.read_csv(tmp_path / "dynamics.csv")
    assert table["otb/energy/sequence_mean"].tolist() == [
        e["otb/energy/sequence_mean"] for e in logged(out)
    ]
    assert (tmp_path / "fig_live_otb.png").stat().st_size > 0
    # The split pooled from the log is the live log's `otb/budget/...` at its last split step.
    assert [b["estimator"] for b in run["budget"]] == ["grpo", "otb"]
    for pooled in run["budget"]:
        assert pooled["step"] == last["step"] == 3
        for pool in ("window", "ema"):
            for field, value in pooled[pool].items():
                key = f"otb/budget/{pooled['estimator']}/{pool}/{field}"
                if key in last:
                    assert value == pytest.approx(last[key], rel=1e-6), key
                else:  # not finite: left out of the log, null in collapse.json
                    assert value is None, key
        assert pooled[pool]["steps"] == 2  # the split steps 1 and 3
    assert (tmp_path / "pooled_noise_scale.png").stat().st_size > 0


def test_every_k_steps(tmp_path: Path) -> None:
    """`every=2` over 3 steps: metrics and dumps at steps 1 and 3 only."""
    trainer = toy_trainer(tmp_path / "run", 3)
    attach(trainer, every=2, dump_dir=tmp_path / "otb", metrics="all")
    trainer.train()
    steps = [e["step"] for e in trainer.state.log_history if "otb/energy/sequence_mean" in e]
    assert steps == [1, 3]
    assert sorted(p.name for p in (tmp_path / "otb").iterdir()) == [
        "step_000001.jsonl",
        "step_000003.jsonl",
    ]


@pytest.fixture(scope="module")
def rloo_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """3 steps of a real RLOOTrainer (no KL penalty) with `attach(dump_dir=...)`."""
    out = tmp_path_factory.mktemp("rloo-live") / "rloo-toy"
    trainer = toy_trainer(
        out, STEPS, rloo=True, beta=0.0, save_strategy="steps", save_steps=1, save_only_model=True
    )
    live = attach(
        trainer, dump_dir=out / "otb", split_every=SPLIT_EVERY, split_k=SPLIT_K, metrics="all"
    )
    assert (live.audited, live.core.aggregation) == (("rloo", {}), "seq-mean-token-sum")
    trainer.train()
    return out


def test_rloo_logs_every_step_and_its_advantages_are_the_registrys_rloo(
    rloo_run: Path, tmp_path: Path
) -> None:
    """RLOOTrainer's advantages R_i − mean_{j≠i} R_j agree with the registry's `rloo` live and
    offline (`energy --trainer-baseline rloo` on the dump), and not with `mean`, `R_i − mean R`,
    which is RLOO's times (n − 1)/n, where a group's rewards differ; the dumped steps give the
    logged numbers back."""
    entries = logged(rloo_run)
    assert [e["step"] for e in entries] == list(range(1, STEPS + 1))
    assert [e["step"] for e in entries if "otb/split/rloo/within" in e] == [1, 3]
    mixed = 0
    for entry in entries:
        assert entry["otb/audit/agrees"] == 1.0, entry["otb/audit/max_abs_diff"]
        assert entry["otb/sum_pi2_from_loss_logits"] == 1.0
        step = entry["step"]
        rollouts = rloo_run / "otb" / f"step_{step:06d}.jsonl"
        for baseline in ("rloo", "mean"):
            args = ("--model-free", "--trainer-baseline", baseline)
            summary = energy(rollouts, tmp_path / f"{step}-{baseline}", *args)
            check_reproduces(summary, entry, rel=1e-6)
            audit = summary["advantage_audit"]
            if baseline == "rloo" or entry["otb/groups/mixed_rewards_fraction"] > 0:
                assert audit["agrees"] == (baseline == "rloo"), (step, baseline, audit)
        mixed += entry["otb/groups/mixed_rewards_fraction"] > 0
    assert mixed  # the audit against `mean` was put to the test


def test_rloo_normalising_its_advantages_is_not_audited(tmp_path: Path) -> None:
    """RLOOConfig's `normalize_advantages=True` standardises the advantages over the batch, no
    registry estimator: no audit rather than a false alarm (its default β = 0.05, whose KL
    shapes the rewards, is audited: tests/integrations/test_trl_configurations.py)."""
    trainer = toy_trainer(tmp_path / "run", 1, rloo=True, normalize_advantages=True)
    assert attach(trainer).audited is None


def test_a_process_group_that_fails_to_gather_switches_off(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(share: Share, place: Dist) -> list[Share]:
        raise RuntimeError("[gloo] Connection closed by peer (simulated)")

    monkeypatch.setattr(live_core, "gather_shares", broken)
    trainer = toy_trainer(tmp_path / "run", 2)
    diagnostics = attach(trainer)
    match = r"switched off at step 1: the step's rows could not be gathered \(RuntimeError: \[gloo"
    with pytest.warns(RuntimeWarning, match=match):
        trainer.train()
    assert_trained_without_diagnostics(trainer, diagnostics)


def test_another_processs_error_stops_every_process_at_the_gather(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Process 1's diagnostics failed (its extra forward ran out of memory, say; it said so):
    it hands the error over at the step's gather, and this process, which had none, stops there
    too, quietly, so no process waits at a later gather for one that stopped."""
    handed = recorded_gather(
        monkeypatch, lambda share: [share, Share(None, "OutOfMemoryError: (simulated)", None)]
    )
    trainer = toy_trainer(tmp_path / "run", 2)
    diagnostics = attach(trainer)
    diagnostics.core.place = Dist(0, 2)  # as under torchrun with 2 processes
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.train()
    assert not [w for w in caught if "otb-diag" in str(w.message)]
    assert len(handed) == 1 and handed[0].rows is not None and handed[0].error is None
    assert_trained_without_diagnostics(trainer, diagnostics)


def test_a_process_whose_batch_failed_still_comes_to_the_gather(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Process 1's rewards could not be formed as step 1's batch was generated, before any
    micro-step trained on it: it says so once, its micro-steps still count the batch's rows,
    and at the last of them it comes to the gather with its error in place of rows (where the
    other processes wait for it), and every process stops there."""
    first = Share("process 0's rows", None, None)
    handed = recorded_gather(monkeypatch, lambda share: [first, share])
    planted(monkeypatch, trl_integration, "local_rewards", RuntimeError("planted"))
    trainer = toy_trainer(tmp_path / "run", 2)
    diagnostics = attach(trainer)
    diagnostics.core.place = Dist(1, 2)
    with pytest.warns(RuntimeWarning) as caught:
        trainer.train()
    said = [str(w.message) for w in caught if "otb-diag" in str(w.message)]
    assert len(said) == 1 and said[0].endswith("at step 1 (process 1): RuntimeError: planted")
    assert [(s.rows, s.error) for s in handed] == [(None, "RuntimeError: planted")]
    assert_trained_without_diagnostics(trainer, diagnostics)


def test_the_main_processs_error_is_handed_over_at_the_next_gather(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The main process's tables fail at step 1 (after that step's gather): it says so at once,
    logs nothing more, and at step 2's gather hands the error over instead of its rows; every
    process stops there, and step 3 gathers nothing."""
    handed = recorded_gather(monkeypatch, lambda share: [share])
    planted(monkeypatch, live_core, "step_and_split_metrics", ValueError("planted"))
    trainer = toy_trainer(tmp_path / "run", 3)
    diagnostics = attach(trainer)
    diagnostics.core.place = Dist(0, 2)
    with pytest.warns(RuntimeWarning, match=r"at step 1 \(process 0\): ValueError: planted"):
        trainer.train()
    assert [(s.rows is None, s.error) for s in handed] == [
        (False, None),
        (True, "ValueError: planted"),
    ]
    assert not diagnostics.enabled
    assert trainer.state.global_step == 3
    assert not any(k.startswith("otb/") for e in trainer.state.log_history for k in e)


def test_a_trl_whose_batch_lacks_a_field_is_named(tmp_path: Path) -> None:
    """A TRL whose `_generate_and_score_completions` returns no `advantages` (renamed, say):
    one warning naming the method and the field, the batch handed back untouched."""
    trainer = toy_trainer(tmp_path / "run", 1)
    diagnostics = attach(trainer)
    trainer.model.train()
    batch = {k: torch.zeros(4, 3) for k in ("prompt_ids", "prompt_mask", "completion_ids")}
    batch["completion_mask"] = torch.ones(4, 3)
    match = "at step 1: GRPOTrainer._generate_and_score_completions returned no advantages"
    with pytest.warns(RuntimeWarning, match=match):
        output = diagnostics.generate(lambda inputs: dict(batch), None)
    assert output.keys() == batch.keys()
    assert not diagnostics.enabled


def test_a_dump_directory_given_to_another_process_is_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The main process writes the dump: another process's own directory is named at the
    gather, once; one given none (`dump_dir=... if rank == 0 else None`) is fine."""
    main, elsewhere = tmp_path / "main", tmp_path / "elsewhere"
    others = [Share("rows 1", None, None), Share("rows 2", None, elsewhere)]
    monkeypatch.setattr(live_core, "gather_shares", lambda share, place: [share, *others])
    diagnostics = attach(toy_trainer(tmp_path / "run", 1), dump_dir=main)
    match = re.escape(
        f"own dump_dir ({main}); the dump_dir given elsewhere (process 2: {elsewhere})"
    )
    with pytest.warns(RuntimeWarning, match=match):
        assert diagnostics.core.gather(1, lambda: "rows 0") == ["rows 0", "rows 1", "rows 2"]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        diagnostics.core.gather(2, lambda: "rows 0")  # said once
    alone = attach(toy_trainer(tmp_path / "other", 1))  # the main process was given none
    with pytest.warns(RuntimeWarning, match="own dump_dir \\(none, so nothing is dumped\\)"):
        alone.core.gather(1, lambda: "rows 0")


def test_the_extra_forward_gives_what_energys_forward_gives(tmp_path: Path) -> None:
    """`extra_forward=True`: log p and Σπ² of each process's rows from one no-grad forward
    (`otb/sum_pi2_from_loss_logits` = 0); `energy --ckpt` with the weights that sampled step 1
    reproduces the logged step as it does for the loss's logits."""
    out = tmp_path / "run"
    trainer = toy_trainer(out, 1)
    attach(trainer, dump_dir=out / "otb", extra_forward=True, split_every=None, metrics="all")
    trainer.train()
    (entry,) = [e for e in trainer.state.log_history if "otb/energy/sequence_mean" in e]
    assert entry["otb/sum_pi2_from_loss_logits"] == 0.0
    assert entry["otb/audit/agrees"] == 1.0
    rollouts = out / "otb" / "step_000001.jsonl"
    summary = energy(rollouts, tmp_path / "e", "--ckpt", str(default_checkpoint()))
    check_reproduces(summary, entry, rel=1e-4, w_floor=W_FLOOR, token_level_rel=1e-2)


def assert_trained_without_diagnostics(trainer: Any, diagnostics: Any) -> None:
    """The diagnostics switched themselves off, the training ran its 2 steps, and nothing was
    logged under `otb/`."""
    assert not diagnostics.enabled
    assert trainer.state.global_step == 2
    assert not any(k.startswith("otb/") for e in trainer.state.log_history for k in e)
