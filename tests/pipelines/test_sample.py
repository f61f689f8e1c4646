"""`rollouts sample` on the embedded checkpoint: statistics, EOS, truncation, resume, errors."""

import dataclasses
import json
from pathlib import Path

import pytest
import torch
from otb_diag.cli.main import app
from typer.testing import CliRunner

from otb_diag.io.checkpoint import load_checkpoint
from otb_diag.io.scenarios import default_checkpoint
from otb_diag.pipelines.inputs import SampleInputs
from otb_diag.pipelines.results.sample import SampleResult
from otb_diag.pipelines.sample.recipe import SampleSettings, plan_batches, run_sample
from otb_diag.policy.forward_pass import stats_for_sequences
from otb_diag.policy.noise import RowNoise
from otb_diag.policy.sampling import Sampling, row_seed, sample_batch, truncate

runner = CliRunner()
PROMPTS = [
    {"prompt": "C:684=", "answer": "684"},
    {"prompt": "R:096=", "answer": "690"},
    {"prompt": "S:2753=", "answer": "2357"},
]


def write_prompts(path: Path, rows: list[dict] = PROMPTS) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.fixture(scope="module")
def ckpt():
    torch.set_num_threads(1)
    return load_checkpoint(default_checkpoint("default"), dtype="float32")


def test_logged_statistics_agree_with_the_forward_pass_of_energy(ckpt) -> None:
    tok = ckpt.tokenizer
    prompts = [tok(p["prompt"])["input_ids"] for p in PROMPTS for _ in range(6)]
    sampling = Sampling(temperature=0.7, max_new_tokens=30)
    seeds = [row_seed(3, i, 0) for i in range(len(prompts))]
    out = sample_batch(
        ckpt.model, prompts, RowNoise(seeds), sampling, eos_ids=[tok.eos_token_id], pad_id=0
    )
    stats = stats_for_sequences(ckpt.model, prompts, [s.response_ids for s in out], 0.7)
    for s, ref in zip(out, stats, strict=True):
        assert len(s.logprobs) == len(s.response_ids) == len(ref.logprob)
        # float32: 1e-4 relative to the magnitude (log-probs of rare tokens reach -20)
        lp = torch.tensor(s.logprobs)
        assert torch.allclose(lp, ref.logprob, rtol=1e-4, atol=1e-4)
        assert torch.allclose(torch.tensor(s.sum_pi2), ref.sum_pi2, rtol=1e-4, atol=1e-6)


def test_eos_is_kept_and_the_token_limit_sets_truncated(ckpt) -> None:
    tok = ckpt.tokenizer
    prompt = tok("C:684=")["input_ids"]
    seeds = [row_seed(0, 0, j) for j in range(8)]
    full = sample_batch(
        ckpt.model,
        [prompt] * 8,
        RowNoise(seeds),
        Sampling(max_new_tokens=40),
        eos_ids=[tok.eos_token_id],
        pad_id=0,
    )
    assert all(s.response_ids[-1] == tok.eos_token_id and not s.truncated for s in full)
    short = sample_batch(
        ckpt.model,
        [prompt] * 8,
        RowNoise(seeds),
        Sampling(max_new_tokens=2),
        eos_ids=[tok.eos_token_id],
        pad_id=0,
    )
    assert all(s.truncated and len(s.response_ids) == 2 for s in short)
    # the same seeds draw the same first tokens whatever the limit
    assert [s.response_ids[:2] for s in short] == [s.response_ids[:2] for s in full]


def test_a_row_draws_the_same_whatever_shares_its_batch(ckpt) -> None:
    tok = ckpt.tokenizer
    a, b = tok("C:684=")["input_ids"], tok("R:096=")["input_ids"]  # equal lengths: no padding
    s = Sampling(max_new_tokens=12)
    alone = sample_batch(ckpt.model, [a], RowNoise([row_seed(1, 0, 0)]), s, eos_ids=[2], pad_id=0)
    mixed = sample_batch(
        ckpt.model,
        [b, a],
        RowNoise([row_seed(1, 1, 0), row_seed(1, 0, 0)]),
        s,
        eos_ids=[2],
        pad_id=0,
    )
    assert mixed[1] == alone[0]


def test_truncation_keeps_the_top_tokens_only() -> None:
    z = torch.tensor([[3.0, 1.0, 2.0, 0.0]])
    assert torch.isinf(truncate(z, 2, 1.0)).tolist() == [[False, True, False, True]]
    p = z.softmax(-1)[0]  # 0.644, 0.087, 0.237, 0.032: top-p 0.7 keeps the first two by mass
    assert p[0] < 0.7 < p[0] + p[2]
    assert torch.isinf(truncate(z, 0, 0.7)).tolist() == [[False, True, False, True]]


def test_batches_fit_the_token_budget_and_cover_every_pair() -> None:
    batches = plan_batches([3, 5], n=4, max_new=5, budget=30)
    pairs = [p for b in batches for p in b]
    assert pairs == [(i, j) for i in range(2) for j in range(4)]
    # 3·8 ≤ 30 < 4·8; then (0,3),(1,0),(1,1) at width 10: 3·10 ≤ 30; the last two
    assert [len(b) for b in batches] == [3, 3, 2]
    assert plan_batches([100], n=2, max_new=5, budget=10) == [[(0, 0)], [(0, 1)]]


class Killed(Exception):
    """The kill `kill_after` plants once sampling is done."""


def kill_after(
    batches: int,
    inputs: SampleInputs,
    out: Path,
    settings: SampleSettings,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Leave in `out` what a run killed after sampling its first `batches` batches leaves: the
    run is stopped before scoring (every part written, no pools), then the later parts go."""

    def killed(*args: object) -> None:
        raise Killed

    with monkeypatch.context() as patch:
        patch.setattr("otb_diag.pipelines.sample.recipe._score", killed)
        with pytest.raises(Killed):
            run_sample(inputs, out, settings, progress=False)
    parts = sorted((out / ".sample-parts").glob("part-*.jsonl"))
    assert len(parts) > batches
    for part in parts[batches:]:
        part.unlink()


def test_resumed_run_writes_exactly_the_uninterrupted_pools(
    ckpt, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    prompts = write_prompts(tmp_path / "p.jsonl")
    settings = SampleSettings(
        n=6, sampling=Sampling(max_new_tokens=16), verifier="exact", batch_tokens=100
    )
    whole = run_sample(
        SampleInputs(prompts, ckpt.path), tmp_path / "whole", settings, progress=False
    )
    assert whole is not None and whole.batches > 3
    kill_after(2, SampleInputs(prompts, ckpt.path), tmp_path / "cut", settings, monkeypatch)
    assert not (tmp_path / "cut/rollouts.jsonl").exists()
    with pytest.raises(Exception, match="--resume"):
        run_sample(SampleInputs(prompts, ckpt.path), tmp_path / "cut", settings, progress=False)
    resume = dataclasses.replace(settings, resume=True)
    run_sample(SampleInputs(prompts, ckpt.path), tmp_path / "cut", resume, progress=False)
    a = (tmp_path / "whole/rollouts.jsonl").read_text()
    assert a == (tmp_path / "cut/rollouts.jsonl").read_text()
    assert not (tmp_path / "cut/.sample-parts").exists()
    rows = [json.loads(line) for line in a.splitlines()]
    assert len(rows) == 18 and {r["group"] for r in rows} == {"p00000", "p00001", "p00002"}
    assert [r["reward"] for r in rows] == [
        float(r["response"] == PROMPTS[int(r["group"][1:])]["answer"]) for r in rows
    ]


def test_resume_with_other_settings_is_refused(
    ckpt, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    prompts = write_prompts(tmp_path / "p.jsonl")
    settings = SampleSettings(
        n=4, sampling=Sampling(max_new_tokens=8), verifier="exact", batch_tokens=60
    )
    kill_after(1, SampleInputs(prompts, ckpt.path), tmp_path / "o", settings, monkeypatch)
    other = SampleSettings(
        n=4,
        sampling=Sampling(max_new_tokens=8),
        verifier="exact",
        batch_tokens=60,
        seed=1,
        resume=True,
    )
    with pytest.raises(Exception, match="seed"):
        run_sample(SampleInputs(prompts, ckpt.path), tmp_path / "o", other, progress=False)


def test_cli_writes_pools_that_inspect_reads_with_top_k_flagged(tmp_path: Path) -> None:
    prompts = write_prompts(tmp_path / "p.jsonl")
    out = tmp_path / "pools"
    result = runner.invoke(
        app,
        [
            "rollouts",
            "sample",
            "--prompts",
            str(prompts),
            "--n",
            "4",
            "--max-new-tokens",
            "10",
            "--verifier",
            "exact",
            "--top-k",
            "1",
            "--out",
            str(out),
            "--quiet",
            "--json",
        ],
    )
    assert result.exit_code == 0, result.output
    manifest = json.loads((out / "manifest.json").read_text())
    # --json prints manifest.json, versioned like every record, and it reads back as the result
    assert json.loads(result.stdout) == manifest
    assert list(manifest)[:3] == ["schema_version", "command", "checkpoint"]
    assert manifest["command"] == "rollouts sample"
    sampled = SampleResult.from_json(manifest, out / "manifest.json")
    assert sampled.to_json() == manifest and sampled.distributed.world_size == 1
    assert sampled.settings["from_policy"] is False and sampled.settings["top_k"] == 1
    rows = [json.loads(line) for line in (out / "rollouts.jsonl").read_text().splitlines()]
    # top-k 1 is greedy: every response to a prompt is the same
    for g in ("p00000", "p00001"):
        assert len({tuple(r["response_ids"]) for r in rows if r["group"] == g}) == 1
    inspect = runner.invoke(app, ["rollouts", "inspect", str(out), "--json"])
    assert inspect.exit_code == 0, inspect.output
    assert json.loads(inspect.stdout)["rows"] == 12


def test_groups_of_one_are_said_at_sampling_and_at_reading(ckpt, tmp_path: Path) -> None:
    """`--n 1` samples groups of one, where a group baseline has nothing to compare: a warning
    when sampling, and again when the pools are read (`rollouts inspect`, as `energy` and
    `variance-compare` read them)."""
    from otb_diag.pipelines.inputs import Inputs
    from otb_diag.pipelines.inspect.recipe import run_inspect

    prompts = write_prompts(tmp_path / "p.jsonl")
    settings = SampleSettings(n=1, sampling=Sampling(max_new_tokens=4), verifier="exact")
    said: list[str] = []
    out = tmp_path / "pools"
    run_sample(SampleInputs(prompts, ckpt.path), out, settings, progress=False, say=said.append)
    warning = (
        "warning: every one of the 3 groups holds one response: with groups of one every group "
        "baseline (mean, rloo, otb, ...) is 0 and equals none, so the rewards give no group "
        "baseline signal; sample pools of 2 or more responses per prompt (rollouts sample --n)"
    )
    assert warning in said
    read: list[str] = []
    run_inspect(Inputs(ckpt=[ckpt.path], rollouts=out), say=read.append)
    assert read == [warning]


def _bad(tmp_path: Path, rows: list[dict] | None, *extra: str, parts: bool = False) -> str:
    prompts = write_prompts(tmp_path / "p.jsonl", rows if rows is not None else PROMPTS)
    out = tmp_path / "pools"
    result = runner.invoke(
        app,
        [
            "rollouts",
            "sample",
            "--prompts",
            str(prompts),
            "--n",
            "2",
            "--max-new-tokens",
            "4",
            "--out",
            str(out),
            "--quiet",
            *extra,
        ],
    )
    assert result.exit_code == 2, result.output
    # a verifier failing after sampling leaves only the samples, for --resume
    assert sorted(p.name for p in out.iterdir()) == [".sample-parts"] if parts else not out.exists()
    errors = [line for line in result.stderr.splitlines() if line.startswith("otb-diag: error:")]
    assert len(errors) == 1, result.stderr
    return errors[0]


def test_bad_input_is_one_paragraph_naming_where_and_nothing_is_written(tmp_path: Path) -> None:
    empty = _bad(tmp_path, [PROMPTS[0], {"prompt": "  ", "answer": "1"}], "--verifier", "exact")
    assert "p.jsonl, line 2, field 'prompt'" in empty and "empty" in empty
    missing = _bad(tmp_path, [PROMPTS[0], {"prompt": "C:12="}], "--answer-column", "answer")
    assert "line 2, field 'answer'" in missing
    needs = _bad(tmp_path, [{"prompt": "C:12="}], "--verifier", "exact")
    assert "line 1, field 'answer'" in needs and "needs an answer" in needs
    unknown = _bad(tmp_path, None, "--verifier", "nope")
    assert "field 'verifier'" in unknown and "last-number" in unknown
    long = _bad(
        tmp_path,
        [PROMPTS[0], {"prompt": "C:" + "1" * 200 + "=", "answer": "1"}],
        "--verifier",
        "exact",
    )
    assert "line 2, field 'prompt'" in long and "context" in long
    zero = _bad(tmp_path, None, "--n", "0")
    assert "--n: must be at least 1, got 0" in zero


def test_a_verifier_that_raises_names_prompt_and_response_and_writes_nothing(
    tmp_path: Path,
) -> None:
    (tmp_path / "v.py").write_text(
        "def fn(prompt, response, answer):\n"
        "    if prompt.startswith('R'):\n        raise ValueError('boom')\n    return 1.0\n"
    )
    message = _bad(tmp_path, None, "--verifier", f"{tmp_path / 'v.py'}:fn", parts=True)
    assert "line 2" in message and "response 0" in message and "boom" in message
