"""The live core's seam: a third adapter, a plain PyTorch policy-gradient loop (REINFORCE with
the group mean as baseline, a few dozen lines, no trainer library) on the embedded checkpoint,
hands each step's rows to `LiveCore` as TRL's and verl's adapters do, and gets the same
features: the metrics `otb-diag energy --model-free` gives on the dumped step, the audit of
its own advantages, the collapse watch, the pooled split, the dashboard's level and the full
record `dynamics` reads."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from otb_diag.cli.main import app
from transformers import AutoModelForCausalLM, AutoTokenizer
from trl_toy import PROMPTS, correct
from typer.testing import CliRunner
from unwritten_figures import unwritten_figures

from otb_diag.integrations.generation_stats import GenerationStats
from otb_diag.integrations.live_core import LiveCore
from otb_diag.io.scenarios import default_checkpoint
from otb_diag.maths.response_batch import ResponseBatch
from otb_diag.policy.scores.token_scores import token_scores

N, STEPS, TAU, K = 4, 3, 1.5, 8


def plain_loop(out: Path) -> LiveCore:
    """STEPS steps of REINFORCE on 2 prompts × N; every step measured by the core."""
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(default_checkpoint())
    tokenizer = AutoTokenizer.from_pretrained(default_checkpoint())
    caught = GenerationStats(model, TAU)  # log p and Σπ² of the sampling forwards
    core = LiveCore(("mean", {}), None, "token-mean", record_dir=out, dump_dir=out / "otb")
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-2)
    for step in range(1, STEPS + 1):
        prompts = PROMPTS[2 * step - 2 : 2 * step]
        ids = torch.tensor(tokenizer(prompts)["input_ids"])  # six tokens each: no padding
        with torch.no_grad():
            out_ids = model.generate(
                input_ids=ids, do_sample=True, temperature=TAU, top_k=0, max_new_tokens=6,
                num_return_sequences=N, pad_token_id=0,
            )  # fmt: skip
        logp, sum_pi2 = caught.taken()
        completions = out_ids[:, ids.shape[1] :]
        texts = tokenizer.batch_decode(completions, skip_special_tokens=True)
        rows = [p for p in prompts for _ in range(N)]
        reward = torch.tensor(correct(rows, texts))
        advantage = reward - reward.view(-1, N).mean(1).repeat_interleave(N)  # A = R − mean
        batch = ResponseBatch.from_padded(
            group_names=prompts, group=torch.arange(len(rows)) // N,
            prompt_ids=[ids[i // N].tolist() for i in range(len(rows))], response_ids=completions,
            length=torch.full((len(rows),), completions.shape[1]), temperature=TAU, step=step,
            reward=reward, logprobs=logp, sum_pi2=sum_pi2, trainer_advantage=advantage,
        )  # fmt: skip
        model.eval()  # the split's scores: the weights that sampled the batch
        scores = token_scores(model, batch, "head", K, 0).proj
        metrics = core.measure(batch, step, scores)
        model.train()
        logits = model(out_ids).logits[:, ids.shape[1] - 1 : -1] / TAU
        token_logp = logits.log_softmax(-1).gather(-1, completions[..., None])[..., 0]
        loss = -(advantage[:, None] * token_logp).mean()  # ∇ = −E[A ∇log π]
        optimizer.zero_grad()
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1e9)
        optimizer.step()
        core.add_grad_norm(step, float(grad_norm))
        core.finish(step, metrics)
    return core


def test_a_plain_pytorch_loop_gets_every_live_feature(tmp_path: Path) -> None:
    core = plain_loop(tmp_path)
    lines = (tmp_path / "otb_metrics.jsonl").read_text().splitlines()
    record = [json.loads(line) for line in lines]
    assert [r["step"] for r in record] == [1, 2, 3]
    last = record[-1]
    assert all(last[k] == v for k, v in core.last.items() if k in last)  # non-finite left out
    assert len(last) > 100
    assert last["otb/audit/agrees"] == 1.0  # its advantages are the registry's `mean`
    assert "otb/collapse/alarm" in last and "otb/split/mean/within" in last
    assert last["otb/budget/mean/window/steps"] == 3  # the split pooled over the 3 steps
    assert 0 < len(core.logged(core.last)) <= 20  # the dashboard's level
    with unwritten_figures():  # the dumped step reads back as the logged numbers
        result = CliRunner().invoke(app, ["energy", "--model-free", "--rollouts",
                                          str(tmp_path / "otb" / "step_000003.jsonl"),
                                          "--out", str(tmp_path / "e3"), "--quiet"])  # fmt: skip
    assert result.exit_code == 0, result.output
    summary = json.loads((tmp_path / "e3" / "summary.json").read_text())
    energy = summary["energy"]["sequence_energy_mean"]
    assert energy == pytest.approx(last["otb/energy/sequence_mean"], rel=1e-6)
