"""`compute_otb_metrics` on verl's own objects (verl 0.9.1: `verl.protocol.DataProto`, tensordict's
`TensorDict`, `core_algos`' advantage functions), at both of verl's advantage steps, built as
verl builds them:

- V0, `RayPPOTrainer.fit` (`trainer.use_v1=false`): one `DataProto` holding the whole batch,
  `prompts` left-padded and `responses` right-padded to the configured lengths, the
  `attention_mask` over both, `uid` in `non_tensor_batch`, advantages from
  `compute_advantage`'s estimator (`core_algos.get_adv_estimator_fn`);
- V1, `trainer_base._compute_advantage` (verl 0.9's default): the transfer queue's rows
  (one response each, its fields unpadded: `tq.kv_batch_get` returns a `TensorDict` of jagged
  tensors and the `uid` strings), made into `DataProto(batch=data.to_padded_tensor())` with
  `token_level_scores = rm_scores`, `uid` popped into `non_tensor_batch` and, without a KL
  penalty, `token_level_rewards = token_level_scores`; in the replay buffer's order, padded
  to the longest response only. V1's advantage step selects neither `responses` nor
  `sum_pi_squared`: docs/live.md says what to add; here they are added as it says.

The same rows give the same metrics at both steps."""

from __future__ import annotations

import functools
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from integrations.test_verl_scores import assert_same_split

from otb_diag.errors import InputError
from otb_diag.integrations.verl.adapter import compute_otb_metrics, dump_batch
from otb_diag.integrations.verl.scores import (
    OTB_SCORES,
    SPLIT_K,
    OTBScores,
    enable_otb_scores,
    with_otb_scores,
)
from otb_diag.io.scenarios import default_checkpoint
from otb_diag.maths.energy.token_stats import stats_from_logits

verl = pytest.importorskip("verl", reason="verl is not installed (make setup-verl)")
pytestmark = pytest.mark.verl

from tensordict import NonTensorStack, TensorDict  # noqa: E402  verl's dependency
from verl.protocol import DataProto  # noqa: E402
from verl.trainer.ppo import core_algos  # noqa: E402

PROMPTS, N, V, MAX_PROMPT, MAX_RESPONSE = 3, 4, 11, 4, 9


def sampled(seed: int) -> list[dict]:
    """The step's responses, prompt-major, unpadded: what the agent loop puts in the queue."""
    g = torch.Generator().manual_seed(seed)
    rows = []
    for p in range(PROMPTS):
        prompt = torch.randint(3, V, (int(torch.randint(1, MAX_PROMPT + 1, (1,), generator=g)),))
        for session in range(N):
            length = int(torch.randint(2, MAX_RESPONSE - 1, (1,), generator=g))
            ids = torch.randint(3, V, (1, length), generator=g)
            stats = stats_from_logits(3 * torch.randn(1, length, V, generator=g), ids)
            score = torch.zeros(length)
            score[-1] = float(torch.randint(0, 2, (1,), generator=g))
            rows.append({
                "uid": f"prompt-{seed}-{p}", "key": f"prompt-{seed}-{p}_{session}_0",
                "prompts": prompt.clone(), "responses": ids[0],
                "response_mask": torch.ones(length, dtype=torch.int64),
                "rm_scores": score, "old_log_probs": stats.logprob[0],
                "sum_pi_squared": stats.sum_pi2[0],
            })  # fmt: skip
    return rows


def advantages(name: str, rewards, mask, uid, logp, sum_pi2) -> torch.Tensor:
    """The estimator's advantages, called as `ray_trainer.compute_advantage` calls it (OTB gets
    `old_log_probs` and `sum_pi_squared` besides)."""
    kwargs = {"token_level_rewards": rewards, "response_mask": mask, "index": uid, "config": None}
    if name == "optimal_token_baseline":
        kwargs |= {"old_log_probs": logp, "sum_pi_squared": sum_pi2}
    out, _ = core_algos.get_adv_estimator_fn(name)(**kwargs)
    return out


def v0_batch(rows: list[dict], estimator: str) -> DataProto:
    """`fit`'s batch after `compute_advantage`."""
    b = len(rows)

    def right(name: str, dtype=torch.float32) -> torch.Tensor:
        out = torch.zeros(b, MAX_RESPONSE, dtype=dtype)
        for i, r in enumerate(rows):
            out[i, : len(r[name])] = r[name]
        return out

    prompts = torch.zeros(b, MAX_PROMPT, dtype=torch.int64)
    prompt_mask = torch.zeros(b, MAX_PROMPT, dtype=torch.int64)
    for i, r in enumerate(rows):
        prompts[i, MAX_PROMPT - len(r["prompts"]) :] = r["prompts"]
        prompt_mask[i, MAX_PROMPT - len(r["prompts"]) :] = 1
    response_mask = right("response_mask", torch.int64)
    fields = {
        "prompts": prompts, "responses": right("responses", torch.int64),
        "attention_mask": torch.cat([prompt_mask, response_mask], dim=1),
        "response_mask": response_mask, "old_log_probs": right("old_log_probs"),
        "sum_pi_squared": right("sum_pi_squared"), "token_level_scores": right("rm_scores"),
    }  # fmt: skip
    fields["token_level_rewards"] = fields["token_level_scores"]
    uid = np.array([r["uid"] for r in rows], dtype=object)
    fields["advantages"] = advantages(
        estimator, fields["token_level_rewards"], response_mask.float(), uid,
        fields["old_log_probs"], fields["sum_pi_squared"],
    )  # fmt: skip
    return DataProto.from_dict(tensors=fields, non_tensors={"uid": uid}, meta_info={})


def v1_batch(rows: list[dict], estimator: str, uid_field: str = "uid") -> DataProto:
    """`_compute_advantage`'s `DataProto`, rows in the replay buffer's order (here reversed)."""
    rows = rows[::-1]
    names = ("responses", "response_mask", "rm_scores", "old_log_probs", "sum_pi_squared")
    data = TensorDict(
        {
            "uid": NonTensorStack(*[r[uid_field] for r in rows]),
            **{
                k: torch.nested.nested_tensor([r[k] for r in rows], layout=torch.jagged)
                for k in names
            },
        },
        batch_size=len(rows),
    )
    data = DataProto(batch=data.to_padded_tensor())
    data.batch["token_level_scores"] = data.batch["rm_scores"]
    data.non_tensor_batch["uid"] = np.array(data.batch.pop("uid").tolist(), dtype=object)
    data.batch["token_level_rewards"] = data.batch["token_level_scores"]
    data.batch["advantages"] = advantages(
        estimator, data.batch["token_level_rewards"], data.batch["response_mask"].float(),
        np.array([r["uid"] for r in rows], dtype=object),  # the prompts' uids, as verl groups
        data.batch["old_log_probs"], data.batch["sum_pi_squared"],
    )  # fmt: skip
    return data


@pytest.mark.parametrize("estimator", ["grpo", "optimal_token_baseline"])
def test_v1_and_v0_batches_give_the_same_metrics(estimator: str) -> None:
    rows = sampled(seed=1)
    v0 = compute_otb_metrics(v0_batch(rows, estimator), adv_estimator=estimator)
    v1 = compute_otb_metrics(v1_batch(rows, estimator), adv_estimator=estimator)
    assert v0["otb/audit/agrees"] == v1["otb/audit/agrees"] == 1.0  # verl's own advantages
    assert v1.keys() == v0.keys()
    for name, value in v0.items():
        if name == "otb/audit/max_abs_diff":  # float32 rounding of two equal computations
            assert v1[name] <= 1e-6, name
            continue
        assert v1[name] == pytest.approx(value, rel=1e-6, abs=1e-12, nan_ok=True), name


def test_v1_keys_as_uids_group_by_the_prompt() -> None:
    """A V1 batch whose `uid` holds the queue's keys `{uid}_{session}_{index}` (the dump's form)
    groups as the prompts' uids do; a batch mixing the forms is refused at its row."""
    rows = sampled(seed=2)
    by_uid = compute_otb_metrics(v1_batch(rows, "grpo"), adv_estimator="grpo")
    by_key = compute_otb_metrics(v1_batch(rows, "grpo", uid_field="key"), adv_estimator="grpo")
    assert by_key == by_uid
    mixed = v1_batch(rows, "grpo", uid_field="key")
    mixed.non_tensor_batch["uid"][3] = rows[::-1][3]["uid"]
    with pytest.raises(InputError, match="is a prompt's own uid, but the first uid") as error:
        compute_otb_metrics(mixed)
    assert (error.value.row, error.value.field) == (3, "uid")


def test_v1_batch_without_prompts_is_not_dumped(tmp_path) -> None:
    with pytest.raises(InputError, match="no prompt ids") as error:
        dump_batch(v1_batch(sampled(seed=3), "grpo"), tmp_path / "dumps", step=1)
    assert error.value.field == "prompts"
    assert not (tmp_path / "dumps").exists() or not any((tmp_path / "dumps").iterdir())
    dump_batch(v0_batch(sampled(seed=3), "grpo"), tmp_path / "v0", step=1)  # V0's has them


def test_verl_own_variance_proxy_reads_the_same_batch() -> None:
    """verl's own `metric_utils.compute_variance_proxy_metrics` runs on the V0 batch that
    `compute_otb_metrics` reads (the two dashboards side by side, docs/live.md)."""
    from verl.trainer.ppo.metric_utils import compute_variance_proxy_metrics

    batch = v0_batch(sampled(seed=4), "grpo")
    theirs = compute_variance_proxy_metrics(batch=batch, gradient_norm=1.0)
    ours = compute_otb_metrics(batch, adv_estimator="grpo")
    mask = batch.batch["response_mask"].float()
    w = (1 - 2 * batch.batch["old_log_probs"].exp() + batch.batch["sum_pi_squared"]) * mask
    assert ours["otb/energy/mean_w"] == pytest.approx(float(w.sum() / mask.sum()), rel=1e-5)
    assert any(k.startswith("variance_proxy/") for k in theirs)


TAU = 0.7


def engine_forward(batch: DataProto, **meta) -> dict[str, torch.Tensor]:
    """verl's actor forward over a V0 batch with `meta` (`calculate_sum_pi_squared`, ...), its
    outputs `[B, T, ...]`.

    As `RayPPOTrainer._compute_old_log_prob` sends the batch (`left_right_2_no_padding`), through
    the engine class `with_otb_scores` makes and the steps of `FSDPEngineWithLMHead.forward_step`
    (`prepare_model_inputs`, the model, `prepare_model_outputs`), cut to the responses by
    `no_padding_2_padding` as the trainer cuts them. `forward_step` itself moves the micro-batch
    to the CUDA device (`get_device_id()` raises without CUDA) and the engine's `__init__` wraps
    the model in FSDP on a process group: the engine here is the class without them, its model
    the plain one."""
    from verl.utils import tensordict_utils as tu
    from verl.utils import torch_functional as verl_F
    from verl.workers.engine.fsdp.transformer_impl import FSDPEngineWithLMHead
    from verl.workers.utils.padding import left_right_2_no_padding, no_padding_2_padding

    engine = object.__new__(with_otb_scores(FSDPEngineWithLMHead))
    engine.module, engine.use_ulysses_sp, engine.pad_to_length = actor_model(), False, False
    engine.engine_config = SimpleNamespace(
        entropy_checkpointing=False, entropy_from_logits_with_chunking=False
    )
    engine.compute_entropy_from_logits = verl_F.entropy_from_logits
    attention = batch.batch["attention_mask"]
    batch.batch["input_ids"] = torch.cat([batch.batch["prompts"], batch.batch["responses"]], 1)
    batch.batch["position_ids"] = (attention.cumsum(-1) - 1).clamp_min(0)
    micro = left_right_2_no_padding(batch.to_tensordict())
    tu.assign_non_tensor(micro, temperature=batch.meta_info.get("temperature", 1.0), **meta)
    with torch.no_grad():
        inputs, args = engine.prepare_model_inputs(micro)
        output = engine.module(**inputs, use_cache=False)
        out = engine.prepare_model_outputs(output, args, micro, None)
    return {k: no_padding_2_padding(v, micro) for k, v in out.items()}


@functools.cache
def actor_model():
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(default_checkpoint()).eval()


@pytest.mark.parametrize("remove_padding", [True, False])
def test_the_split_from_verls_actor_forward_is_that_of_model(remove_padding: bool) -> None:
    """The actor's forward with `OTBScores` returns `otb_scores` `[B, T, 64]` beside
    `log_probs` and `sum_pi_squared`; the batch carrying all three gives, with no model, the
    split that `model=` gives on the driver (relative 1e-6, `assert_same_split`)."""
    batch = v0_batch(sampled(seed=5), "grpo")
    batch.meta_info["temperature"] = TAU
    out = engine_forward(batch, calculate_sum_pi_squared=True, use_remove_padding=remove_padding)
    assert out[OTB_SCORES].shape == (*batch.batch["responses"].shape, SPLIT_K)
    batch.batch["old_log_probs"] = out["log_probs"].float()
    batch.batch["sum_pi_squared"] = out["sum_pi_squared"].float()
    on_driver = compute_otb_metrics(batch, adv_estimator="grpo", model=actor_model())
    batch.batch[OTB_SCORES] = out[OTB_SCORES]
    from_workers = compute_otb_metrics(batch, adv_estimator="grpo")
    assert_same_split(from_workers, on_driver, prompts=PROMPTS)


def test_scores_only_where_sum_pi_squared_is_formed() -> None:
    """The reference and update forwards (no `calculate_sum_pi_squared`) carry no scores."""
    out = engine_forward(v0_batch(sampled(seed=6), "grpo"))
    assert set(out) == {"log_probs"}


def test_enable_otb_scores_registers_the_engines() -> None:
    """`enable_otb_scores` swaps verl's registered FSDP language-model engines for the mixed
    ones, once (a second call changes nothing)."""
    from verl.workers.engine.base import EngineRegistry
    from verl.workers.engine.fsdp.transformer_impl import FSDPEngineWithLMHead

    registry = EngineRegistry._engines["language_model"]
    before = {b: dict(registry[b]) for b in ("fsdp", "fsdp2")}
    try:
        enable_otb_scores()
        once = {b: dict(registry[b]) for b in before}
        enable_otb_scores()
        assert {b: dict(registry[b]) for b in before} == once
        for backend, engines in once.items():
            assert engines.keys() == before[backend].keys()
            for key, cls in engines.items():
                assert issubclass(cls, OTBScores) and issubclass(cls, before[backend][key])
        assert issubclass(once["fsdp"]["cuda"], FSDPEngineWithLMHead)
    finally:
        for backend, engines in before.items():
            registry[backend].update(engines)
