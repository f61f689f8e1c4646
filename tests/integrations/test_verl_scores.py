"""The split's scores formed on the actor's log-prob forward (`integrations/verl/scores.py`) give
`compute_otb_metrics(batch)` the split that `model=` gives on the driver.

The forward here is the one verl's actor runs on a padded batch (verl ≤ 0.8's
`DataParallelPPOActor._forward_micro_batch` without remove-padding; verl 0.9's
`FSDPEngineWithLMHead` runs the same model call): `input_ids = [prompts | responses]`, the
`attention_mask` over both, `position_ids = clip(cumsum(mask) − 1, 0)`, the logits at
`[-T-1:-1]` predicting the responses, before the division by τ. verl's engine itself does not
run here: `FSDPEngineWithLMHead` is registered for CUDA and NPU devices only and needs an
initialised process group and an FSDP-wrapped module; these are the tensors it holds."""

from __future__ import annotations

import pytest
import torch
from integrations.test_verl_live import verl_shaped
from transformers import AutoModelForCausalLM

from otb_diag.integrations.core.step_metrics import SPLIT_MODE
from otb_diag.integrations.verl.adapter import compute_otb_metrics, verl_batch
from otb_diag.integrations.verl.scores import OTB_SCORES, forward_scores
from otb_diag.io.scenarios import default_checkpoint
from otb_diag.maths.noise.budget_stream import ONE_STEP_NOISE_SCALE
from otb_diag.maths.noise.step_split import SPLIT, SPLIT_SEED
from otb_diag.policy.scores.token_scores import token_scores

TAU = 0.7


@pytest.fixture(scope="module")
def model():
    return AutoModelForCausalLM.from_pretrained(default_checkpoint()).eval()


def actor_forward_scores(model, fields: dict, k: int) -> torch.Tensor:
    """`[B, T, k]` from the actor's forward over the batch, as a worker forms them."""
    responses, attention = fields["responses"], fields["attention_mask"]
    input_ids = torch.cat([fields["prompts"], responses], dim=1)
    position_ids = (attention.cumsum(-1) - 1).clamp_min(0)
    width = responses.shape[1]
    caught = []  # the output layer's input, as the worker's forward hook receives it
    hook = model.get_output_embeddings().register_forward_hook(
        lambda _m, args, _out: caught.append(args[0])
    )
    with torch.no_grad():
        logits = model(
            input_ids=input_ids, attention_mask=attention, position_ids=position_ids
        ).logits
    hook.remove()
    (hidden,) = caught
    at = slice(-width - 1, -1)  # the positions that predict the responses
    return forward_scores(model, hidden[:, at], logits[:, at], responses, TAU, k)


def test_worker_scores_give_the_split_of_model(model) -> None:
    fields = {**verl_shaped(seed=6), "meta_info": {"temperature": TAU}}
    scores = actor_forward_scores(model, fields, k=64)
    assert scores.shape == (*fields["responses"].shape, 64)
    on_driver = compute_otb_metrics(fields, adv_estimator="grpo", model=model)
    from_workers = compute_otb_metrics({**fields, OTB_SCORES: scores}, adv_estimator="grpo")
    assert_same_split(from_workers, on_driver, prompts=3)


def assert_same_split(ours: dict, theirs: dict, prompts: int) -> None:
    """The same metrics, the split's to float32 rounding of the two forwards' scores (they pad
    the rows differently, so hidden states differ in the last bits): `within`, `between`,
    `total` and `within_share` relative 1e-6; `grad_sq = |ḡ|² − total/P`, a difference of two
    terms, to 1e-6 of their size; the one-step noise scale and `snr`, its ratios to `total`, to
    the relative error that carries."""
    assert ours.keys() == theirs.keys()
    split = [k for k in ours if k.startswith("otb/split/") and k.count("/") == 3]
    for key in [k for k in ours if k not in split]:  # the split's step shape too (P, N, L̄)
        assert ours[key] == theirs[key], key
    baselines = {k.split("/")[2] for k in split}
    assert baselines >= {"grpo", "otb"}
    for b in baselines:
        got, want = (
            {n: m[f"otb/split/{b}/{n}"] for n in SPLIT} for m in (ours, theirs)
        )  # fmt: skip
        for name in ("within", "between", "total", "within_share"):
            assert got[name] == pytest.approx(want[name], rel=1e-6), (b, name)
        terms = abs(want["grad_sq"]) + want["total"] / prompts
        assert got["grad_sq"] == pytest.approx(want["grad_sq"], abs=1e-6 * terms), b
        # grad_sq's relative error (an exact 0, grpo's |G|² on some batches: exact ratios)
        carried = 1e-6 * terms / abs(want["grad_sq"]) + 1e-6 if want["grad_sq"] else 0.0
        for name in ("snr", ONE_STEP_NOISE_SCALE):  # P |G|² / total, total / |G|² (inf if ≤ 0)
            assert got[name] == pytest.approx(want[name], rel=carried), (b, name)
    assert all(ours[f"otb/split/{b}/within"] > 0 for b in ("otb",)), "a split with something in it"


def test_worker_scores_are_token_scores_on_every_valid_token(model) -> None:
    """Per token, the worker's vectors are head mode's, the same projection (SPLIT_SEED)."""
    fields = {**verl_shaped(seed=7), "meta_info": {"temperature": TAU}}
    worker = actor_forward_scores(model, fields, k=16)
    batch = verl_batch(fields)
    head = token_scores(model, batch, SPLIT_MODE, 16, SPLIT_SEED).proj
    valid = batch.valid
    scale = head[valid].abs().max()
    assert (worker[:, : valid.shape[1]][valid] - head[valid]).abs().max() <= 1e-5 * scale
    # a projection of another seed is another sketch: the comparison could fail
    other = token_scores(model, batch, SPLIT_MODE, 16, SPLIT_SEED + 1).proj
    assert (worker[:, : valid.shape[1]][valid] - other[valid]).abs().max() > 1e-2 * scale
