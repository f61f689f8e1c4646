"""The energy tables: model mode, model-free mode, and their agreement."""

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers import GPT2Config, GPT2LMHeadModel

from otb_diag.errors import InputError
from otb_diag.io.loading import load_rollouts
from otb_diag.io.rollouts.to_batch import make_batch
from otb_diag.maths.energy.heterogeneity import group_heterogeneity
from otb_diag.maths.energy.tables import energy_tables, group_table, pick_group, step_summary
from otb_diag.maths.energy.token_stats import logged_stats
from otb_diag.maths.estimators.advantages import batch_advantages, has_tool_output
from otb_diag.maths.estimators.registry import baseline_names
from otb_diag.maths.response_batch import ResponseBatch
from otb_diag.policy.forward_pass import checkpoint_stats

DEFAULT_BASELINES = baseline_names(defaults_only=True)

VOCAB = 40


@pytest.fixture(scope="module")
def model() -> GPT2LMHeadModel:
    torch.manual_seed(0)
    config = GPT2Config(
        vocab_size=VOCAB,
        n_embd=32,
        n_layer=2,
        n_head=2,
        n_positions=64,
        tie_word_embeddings=False,
        bos_token_id=1,
        eos_token_id=1,
    )
    return GPT2LMHeadModel(config).eval()


def make_rows(seed: int = 0, groups: int = 3, size: int = 4) -> list[dict]:
    rng = np.random.default_rng(seed)
    rows = []
    for g in range(groups):
        prompt = rng.integers(2, VOCAB, size=int(rng.integers(1, 6))).tolist()
        for _ in range(size):
            n = int(rng.integers(1, 15))
            rows.append(
                {
                    "group": f"g{g}",
                    "prompt_ids": prompt,
                    "response_ids": rng.integers(2, VOCAB, size=n).tolist(),
                    "reward": float(rng.integers(0, 2)),
                    "temperature": 0.8,
                }
            )
    return rows


def write(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_tables_are_consistent(model, tmp_path: Path) -> None:
    batch = make_batch(load_rollouts(write(tmp_path / "r.jsonl", make_rows())))
    stats = checkpoint_stats(model, batch, batch_tokens=40, chunk_size=7)
    tables = energy_tables(batch, stats)
    tokens, seqs = tables.tokens, tables.sequences
    assert len(tokens) == int(batch.length.sum())
    assert {f"adv_{b}" for b in DEFAULT_BASELINES} <= set(tokens.columns)
    for (g, s), frame in tokens.groupby(["group", "sample"]):
        # W is the running sum of w over generated tokens; the sequence energy is its last value
        np.testing.assert_allclose(frame["W"], np.cumsum(frame["w"] * frame["mask"]), rtol=1e-5)
        row = seqs[(seqs["group"] == g) & (seqs["sample"] == s)].iloc[0]
        assert row["energy"] == pytest.approx(frame["W"].iloc[-1], rel=1e-6)
        assert row["length"] == len(frame)
        # an outcome reward: the return is R at every generated position
        np.testing.assert_allclose(frame["return"], row["reward"])
    # energy_rank orders each group's members by energy, 1 = lowest
    for _, members in seqs.groupby("group"):
        by_rank = members.sort_values("energy_rank")["energy"].to_numpy()
        assert (np.diff(by_rank) >= 0).all()
        assert sorted(members["energy_rank"]) == list(range(1, len(members) + 1))
    assert set(tables.proxies) == set(DEFAULT_BASELINES)
    # verl's expected_w: mean W over responses in verl's w, τ² times ours (the raw logits')
    tau_sq = batch.temperature.numpy() ** 2
    expected_w = (seqs["energy"] * tau_sq).mean()
    assert tables.proxies["none"]["expected_w"] == pytest.approx(expected_w, rel=1e-5)
    assert len(tables.groups) == 3
    assert pick_group(tables.groups) in set(tables.groups["group"])


def test_group_table_takes_each_groups_own_rows_in_order_of_appearance() -> None:
    # Interleaved rows: group "b" is rows 0, 2, 3, group "a" rows 1, 4.
    sequences = pd.DataFrame(
        {"group": ["b", "a", "b", "b", "a"], "length": [3, 1, 2, 4, 2], "reward": [1.0, 0, 0, 1, 0]}
    )
    sequences["generated"] = sequences["length"]
    paths = [np.cumsum(np.arange(1.0, n + 1) * (i + 1)) for i, n in enumerate(sequences["length"])]
    groups = group_table(sequences, paths)
    assert groups["empty_responses"].tolist() == [0, 0]
    assert groups["zero_tail_tokens"].tolist() == [0, 0]  # no tail given
    assert groups["group"].tolist() == ["b", "a"]
    assert groups["size"].tolist() == [3, 2]
    assert groups["mean_reward"].tolist() == [pytest.approx(2 / 3), 0.0]
    assert groups["mixed_rewards"].tolist() == [True, False]
    assert groups[["min_length", "max_length"]].to_numpy().tolist() == [[2, 4], [1, 2]]
    for row, members in zip(groups.to_dict("records"), ([0, 2, 3], [1, 4]), strict=True):
        expected = group_heterogeneity([paths[i] for i in members])
        np.testing.assert_equal({k: row[k] for k in expected}, expected)


def test_model_free_equals_model_mode_on_the_models_own_numbers(model, tmp_path: Path) -> None:
    rows = make_rows(seed=1)
    batch = make_batch(load_rollouts(write(tmp_path / "a.jsonl", rows)))
    stats = checkpoint_stats(model, batch)
    for i, row in enumerate(rows):  # log the model's numbers into the rollouts, as verl can
        n = len(row["response_ids"])
        row["logprobs"] = stats.logprob[i, :n].tolist()
        row["sum_pi2"] = stats.sum_pi2[i, :n].tolist()
    logged = make_batch(load_rollouts(write(tmp_path / "b.jsonl", rows)))
    free = logged_stats(logged)
    torch.testing.assert_close(free.w, stats.w, rtol=1e-4, atol=1e-5)
    a = energy_tables(batch, stats).tokens
    b = energy_tables(logged, free).tokens
    for b_name in DEFAULT_BASELINES:
        np.testing.assert_allclose(a[f"adv_{b_name}"], b[f"adv_{b_name}"], rtol=1e-4, atol=1e-5)
    assert b["entropy"].isna().all()  # the one statistic model-free mode cannot give


def test_model_free_without_sum_pi2_names_the_field(tmp_path: Path) -> None:
    rows = make_rows()
    for row in rows:
        row["logprobs"] = [-1.0] * len(row["response_ids"])
    batch = make_batch(load_rollouts(write(tmp_path / "r.jsonl", rows)))
    with pytest.raises(InputError, match="sum_pi2"):
        logged_stats(batch, path=str(tmp_path / "r.jsonl"))


def test_tool_masks_switch_on_tir(tmp_path: Path) -> None:
    rows = make_rows()
    batch = make_batch(load_rollouts(write(tmp_path / "r.jsonl", rows)))
    assert not has_tool_output(batch.mask, batch.valid)
    rows[0]["mask"] = [1] + [0] * (len(rows[0]["response_ids"]) - 1)
    rows[0]["response_ids"] = rows[0]["response_ids"] + [3]
    rows[0]["mask"] = rows[0]["mask"] + [1]
    tir = make_batch(load_rollouts(write(tmp_path / "t.jsonl", rows)))
    assert has_tool_output(tir.mask, tir.valid)


def test_importance_weights_reach_otb(model, tmp_path: Path) -> None:
    rows = make_rows(seed=2)
    batch = make_batch(load_rollouts(write(tmp_path / "r.jsonl", rows)))
    stats = checkpoint_stats(model, batch)
    plain = energy_tables(batch, stats, ["otb"]).tokens["adv_otb"].to_numpy()
    rho = torch.where(batch.valid, 0.5, 1.0)
    weighted = energy_tables(replace(batch, is_weights=rho), stats, ["otb"]).tokens
    # a constant ρ scales every W by ρ²: the OTB weights are unchanged (up to ε)
    np.testing.assert_allclose(weighted["adv_otb"], plain, rtol=1e-4, atol=1e-6)
    rho = torch.rand(batch.valid.shape, generator=torch.Generator().manual_seed(0)) + 0.5
    changed = energy_tables(replace(batch, is_weights=rho), stats, ["otb"]).tokens["adv_otb"]
    assert not np.allclose(changed, plain)


@settings(max_examples=40, deadline=None)
@given(
    st.integers(0, 2**31 - 1),
    st.integers(1, 5),
    st.integers(1, 4),
    st.integers(1, 9),
    st.booleans(),
)
def test_step_summary_says_what_the_tables_say(seed, groups, size, width, holes) -> None:
    """The live step's summary, computed from tensors, equals the `sequences` and `groups`
    tables' statistics on random batches: empty responses (no token), tool output (mask holes),
    groups of one, all-equal and mixed rewards, zero energies."""
    gen = torch.Generator().manual_seed(seed)
    rows = groups * size
    length = torch.randint(0, width + 1, (rows,), generator=gen)
    tool = (torch.rand(rows, width, generator=gen) < 0.8).long() if holes else None
    logprobs = -torch.rand(rows, width, generator=gen) * 3
    logprobs[torch.rand(rows, width, generator=gen) < 0.2] = 0.0  # p = 1: w = 0
    batch = ResponseBatch.from_padded(
        group_names=[f"g{g}" for g in range(groups)],
        group=torch.arange(rows) // size,
        prompt_ids=[[1]] * rows,
        response_ids=torch.randint(2, VOCAB, (rows, width), generator=gen),
        length=length,
        temperature=0.9,
        step=1,
        tool_mask=tool,
        reward=torch.randint(0, 2, (rows,), generator=gen).float(),
        logprobs=logprobs,
        sum_pi2=torch.exp(2 * logprobs) + (1 - torch.exp(2 * logprobs)) * 0.3,
    )
    stats = logged_stats(batch)
    tables = energy_tables(batch, stats, ["mean"])
    seqs, table = tables.sequences, tables.groups
    computed = batch_advantages(batch, stats.w, ["mean"])
    summary = step_summary(batch, computed.energy)
    expected = {
        "sequence_mean": float(seqs["energy"].mean()),
        "sequence_median": float(seqs["energy"].median()),
        "mean_w": float(seqs["energy"].sum() / max(1, seqs["generated"].sum())),
        "group_cv_median": float(table["energy_cv"].median()),
        "mixed_rewards_fraction": float(table["mixed_rewards"].mean()),
        "empty_responses": float(table["empty_responses"].sum()),
    }
    assert summary == pytest.approx(expected, rel=1e-6, abs=1e-9, nan_ok=True)
