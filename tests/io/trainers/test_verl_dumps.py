"""verl's `rollout_data_dir` from both of verl 0.9.1's trainers, written here exactly as they
write it (verl is not needed):

- `_write_generations` (`verl/trainer/ppo/ray_trainer.py` and `.../v1/trainer_base.py`, the same
  code): `{global_steps}.jsonl`, one `json.dumps(entry, ensure_ascii=False)` line per response
  with `input`, `output`, `gts`, `score`, `step`, then every `reward_extra_infos_dict` list of
  length n (here the rows' logged `prompt_ids`, `response_ids`, `logprobs`, `sum_pi2`, which a
  user's reward extras carry the same way);
- V0 (`RayPPOTrainer`): `uid` the prompt's `uuid4`, the same on its `rollout.n` responses;
- V1 (`trainer_base._log_rollout_data`): `uid` the transfer queue's key
  `{uid}_{session}_{index}` (`agent_loop_tq.py`), rows sorted by
  `(parts[0], int(parts[1]), int(parts[2]))` of `key.rsplit("_", 2)`.

Both read as the same groups, one per prompt, in every command."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest
import torch
from otb_diag.cli.main import app
from typer.testing import CliRunner

from otb_diag.errors import InputError
from otb_diag.io.loading import load_rollout_set
from otb_diag.io.trainers.verl import prompt_uid
from otb_diag.maths.energy.token_stats import stats_from_logits

runner = CliRunner()
PROMPTS, N, V = 3, 4, 13  # prompts per step, rollout.n, vocabulary


def sampled_rows(step: int) -> list[dict]:
    """One step's responses, prompt-major as verl samples them: ids, logged log π and Σπ² of
    random logits (`stats_from_logits`, so every row is physically consistent), 0/1 scores."""
    g = torch.Generator().manual_seed(step)
    rows = []
    for p in range(PROMPTS):
        prompt = torch.randint(3, V, (2 + p,), generator=g).tolist()
        for _ in range(N):
            length = int(torch.randint(1, 6, (1,), generator=g))
            ids = torch.randint(3, V, (1, length), generator=g)
            stats = stats_from_logits(2 * torch.randn(1, length, V, generator=g), ids)
            rows.append(
                {
                    "prompt": p,
                    "input": f"prompt {p} of step {step}",
                    "output": " ".join(map(str, ids[0].tolist())),
                    "score": float(torch.randint(0, 2, (1,), generator=g)),
                    "prompt_ids": prompt,
                    "response_ids": ids[0].tolist(),
                    "logprobs": stats.logprob[0].tolist(),
                    "sum_pi2": stats.sum_pi2[0].tolist(),
                }
            )
    return rows


def write_generations(directory: Path, step: int, rows: list[dict], uids: list[str]) -> Path:
    """verl's `_write_generations(inputs, outputs, gts, scores, reward_extra_infos_dict, ...)`
    with `reward_extra_infos_dict = {"uid": uids, <the logged fields>}`."""
    n = len(rows)
    base_data = {
        "input": [r["input"] for r in rows],
        "output": [r["output"] for r in rows],
        "gts": [None] * n,
        "score": [r["score"] for r in rows],
        "step": [step] * n,
    }
    extras = {"uid": uids} | {
        k: [r[k] for r in rows] for k in ("prompt_ids", "response_ids", "logprobs", "sum_pi2")
    }
    for k, v in extras.items():
        if len(v) == n:
            base_data[k] = v
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{step}.jsonl"
    with path.open("w") as f:
        for i in range(n):
            entry = {k: v[i] for k, v in base_data.items()}
            f.write(json.dumps(entry, ensure_ascii=False) + "\n")
    return path


def v0_dump(directory: Path, steps: range) -> None:
    """`RayPPOTrainer`: each prompt's `uuid4` on its responses, in sampling order."""
    for step in steps:
        rows = sampled_rows(step)
        prompt_uuid = [str(uuid.UUID(int=1000 * step + p)) for p in range(PROMPTS)]
        write_generations(directory, step, rows, [prompt_uuid[r["prompt"]] for r in rows])


def v1_keys(step: int) -> list[str]:
    """The transfer queue's keys of a step's rows, `f"{uid}_{session_id}_{i}"`, i = 0."""
    keys, sessions = [], {}
    for p in [r["prompt"] for r in sampled_rows(step)]:
        session = sessions[p] = sessions.get(p, -1) + 1
        keys.append(f"{uuid.UUID(int=1000 * step + p)}_{session}_0")
    return keys


def v1_dump(directory: Path, steps: range, keys=v1_keys) -> None:
    """V1's `_log_rollout_data`: the rows in the replay buffer's order (here reversed), sorted
    by verl's key, uid = the keys."""
    for step in steps:
        rows, batch_keys = sampled_rows(step)[::-1], keys(step)[::-1]
        sort_keys = []
        for key in batch_keys:
            parts = key.rsplit("_", 2)
            if len(parts) == 3:
                sort_keys.append((parts[0], int(parts[1]), int(parts[2])))
            else:
                sort_keys.append((key, 0, 0))
        order = sorted(range(len(sort_keys)), key=lambda i: sort_keys[i])
        write_generations(directory, step, [rows[i] for i in order], [batch_keys[i] for i in order])


def test_prompt_uid_reads_both_forms() -> None:
    assert prompt_uid("3f2a-9c_1_0") == ("3f2a-9c", "3f2a-9c_1")
    assert prompt_uid("a_b_12_3") == ("a_b", "a_b_12")  # rsplit("_", 2): the uid keeps its "_"
    assert prompt_uid("3f2a-9c") == ("3f2a-9c", None)
    assert prompt_uid("x_1") == ("x_1", None)  # two parts: not a V1 key
    assert prompt_uid("x_a_0") == ("x_a_0", None)  # session not a number


def test_v1_dump_reads_as_the_v0_groups(tmp_path: Path) -> None:
    v0_dump(tmp_path / "v0", range(1, 3))
    v1_dump(tmp_path / "v1", range(1, 3))
    v0, v1 = (load_rollout_set(tmp_path / d) for d in ("v0", "v1"))
    assert v1.rollouts.format == "verl-jsonl"
    assert list(v1.groups) == list(v0.groups)  # the prompts' uids, in the same order
    assert [len(rows) for rows in v1.groups.values()] == [N] * (2 * PROMPTS)

    def members(s):  # each group's responses, as (step, ids, reward), in sample order
        return {
            g: [
                (s.rollouts.responses[i].response_ids, s.rollouts.responses[i].reward) for i in rows
            ]
            for g, rows in s.groups.items()
        }

    assert members(v1) == members(v0)  # V1's sort by (uid, session) is the sampling order


@pytest.mark.slow  # runs a command end to end (a real run: seconds)
def test_every_command_reads_v1_groups_whole(tmp_path: Path) -> None:
    """`rollouts inspect` counts one group per prompt and no singletons; `energy --model-free`
    gives the V0 dump's numbers."""
    v0_dump(tmp_path / "v0", range(1, 3))
    v1_dump(tmp_path / "v1", range(1, 3))
    result = runner.invoke(app, ["rollouts", "inspect", str(tmp_path / "v1"), "--json"])
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert (summary["rows"], summary["groups"]) == (2 * PROMPTS * N, 2 * PROMPTS)
    assert summary["singleton_groups"] == []
    energy = {}
    for form in ("v0", "v1"):
        out = tmp_path / f"energy-{form}"
        args = ["energy", "--model-free", "--rollouts", str(tmp_path / form), "--out", str(out)]
        result = runner.invoke(app, [*args, "--quiet"])
        assert result.exit_code == 0, result.output
        energy[form] = json.loads((out / "summary.json").read_text())
    for part in ("energy", "proxies"):
        assert energy["v1"][part] == energy["v0"][part], part
    assert energy["v1"]["energy"]["group_energy_cv_median"] > 0  # groups of N, not of one


def test_a_dump_mixing_both_forms_is_refused(tmp_path: Path) -> None:
    def mixed(step: int) -> list[str]:
        keys = v1_keys(step)
        return [k if i != 5 else k.rsplit("_", 2)[0] for i, k in enumerate(keys)]

    v1_dump(tmp_path / "mixed", range(1, 2), keys=mixed)
    lines = (tmp_path / "mixed" / "1.jsonl").read_text().splitlines()
    plain = next(i for i, line in enumerate(lines, 1) if "_" not in json.loads(line)["uid"])
    with pytest.raises(InputError) as error:
        load_rollout_set(tmp_path / "mixed")
    assert (error.value.line, error.value.field) == (plain, "uid")
    assert "is a prompt's own uid, but the first uid" in error.value.message
    assert "{uid}_{session}_{index}" in error.value.message


def test_two_outputs_of_one_session_are_refused(tmp_path: Path) -> None:
    """A multi-output agent loop's session `{uid}_0` with outputs 0 and 1."""

    def multi(step: int) -> list[str]:
        keys = v1_keys(step)
        return [keys[0], keys[0][:-1] + "1", *keys[2:]]

    v1_dump(tmp_path / "multi", range(1, 2), keys=multi)
    with pytest.raises(InputError, match=r"is a second output of session '.*_0' \(after") as e:
        load_rollout_set(tmp_path / "multi")
    assert (e.value.line, e.value.field) == (2, "uid")
    result = runner.invoke(app, ["rollouts", "inspect", str(tmp_path / "multi")])
    assert result.exit_code == 2 and "compute_advantage_for_multi_trajectories" in result.output
    assert "Traceback" not in result.output
