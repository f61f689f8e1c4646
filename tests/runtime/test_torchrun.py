"""torchrun (the tests marked `torchrun`): 2 gloo processes on the CPU write what 1 process
writes (energy, also over a directory of step files with --steps and the advantage audit;
variance-compare proxy/head/full; rollouts inspect prints the same; rollouts sample, also
resumed after a failure; one launch runs them all, tests/runtime/torchrun_commands.py, but the
failing sample, whose process exit status torchrun reports), a rank's own bad input stops
every rank with one paragraph, more ranks than groups is refused (both in that launch too). In
this process, without a launch:
`--device-map auto` measures what a plain load measures, `--device auto` in every --help,
device errors, staging clean-up, and the sharding and proxy-combining rules."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from launch import torchrun
from otb_diag.cli.main import app
from typer.testing import CliRunner
from unwritten_figures import unwritten_figures

from otb_diag.io.atomic import staged_output
from otb_diag.io.scenarios import DEFAULT_ROLLOUTS, default_checkpoint
from otb_diag.maths.energy.proxies import combine_proxies, variance_proxies
from otb_diag.runtime.torchrun import shard_by_tokens

runner = CliRunner()
# Small on purpose: every claim below holds at any size, and CI pays for each rank's start-up.
GROUPS, PER_GROUP = 3, 8  # 3 groups over 2 ranks: shares of unequal size
VARIANCE = ["--mode", "proxy,head,full", "--group-sizes", "2,4", "--draws", "20"]
VARIANCE += ["--bootstrap", "30", "--sketch-dim", "32"]


def reduced(path: Path, groups: int, per_group: int, edit=None) -> Path:
    """The first `per_group` responses of the first `groups` groups of the embedded rollouts."""
    kept: dict[str, list[dict]] = {}
    for line in DEFAULT_ROLLOUTS.read_text(encoding="utf-8").splitlines():
        row = json.loads(line)
        if row["group"] not in kept and len(kept) == groups:
            continue
        members = kept.setdefault(row["group"], [])
        if len(members) < per_group:
            members.append(row)
    rows = [r for members in kept.values() for r in members]
    if edit:
        edit(rows)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def one_process(*args: str | Path) -> None:
    """`otb-diag ARGS` in this process, its figures drawn, not rendered (the tests compare the
    outputs' names, the figures' files are tested in tests/cli and tests/plots)."""
    with unwritten_figures():
        result = runner.invoke(app, [str(a) for a in args])
    assert result.exit_code == 0, result.output


def assert_frames_close(a: pd.DataFrame, b: pd.DataFrame, rtol: float = 1e-4) -> None:
    assert list(a.columns) == list(b.columns) and a.shape == b.shape
    for col in a.columns:
        x, y = a[col].to_numpy(), b[col].to_numpy()
        if a[col].dtype.kind in "fc":
            finite = np.abs(x[np.isfinite(x)])
            scale = finite.max() if finite.size else 1.0
            np.testing.assert_allclose(x, y, rtol=rtol, atol=rtol * scale, err_msg=col)
        else:
            assert (x == y).all(), col


@dataclass(frozen=True)
class Ranks:
    """Output of each command, run once and shared by the assertions: `one`/`two` are 1 process
    and 2 gloo ranks on the same inputs; the 2-rank runs are one launch (`torchrun_commands.py`,
    each rank starts once), whose per-rank records (exit status of each command, thread names
    after the session) and per-rank stdout and stderr (`NAME.rank{r}.out`, `.err`) are in
    `launch`; `bad` and `refused` are the `--out` of the two commands that must fail."""

    energy_one: Path
    energy_two: Path
    variance_one: Path
    variance_two: Path
    steps_one: Path
    steps_two: Path
    inspect_one: str
    sample_two: Path
    launch: Path
    bad: Path
    refused: Path

    def err(self, name: str) -> tuple[str, str]:
        """What command `name` wrote to stderr on rank 0 and on rank 1."""
        return tuple((self.launch / f"{name}.rank{r}.err").read_text() for r in (0, 1))


@pytest.fixture(scope="module")
def inputs(tmp_path_factory: pytest.TempPathFactory) -> list[str | Path]:
    """Options shared by the runs below: the embedded checkpoint, reduced rollouts, quiet."""
    rollouts = reduced(tmp_path_factory.mktemp("dist") / "r.jsonl", GROUPS, PER_GROUP)
    return ["--ckpt", default_checkpoint(), "--rollouts", rollouts, "--quiet"]


@pytest.fixture(scope="module")
def energy_one(tmp_path_factory: pytest.TempPathFactory, inputs: list) -> Path:
    """`energy` in this process on the reduced rollouts."""
    out = tmp_path_factory.mktemp("dist") / "e1"
    one_process("energy", *inputs, "--out", out)
    return out


def step_args(dumps: Path) -> list[str | Path]:
    """energy over a directory of step files, `--steps 2-3`, the advantage audit against otb."""
    args = ["energy", "--ckpt", default_checkpoint(), "--rollouts", dumps, "--steps", "2-3"]
    return [*args, "--trainer-baseline", "otb", "--quiet"]


@pytest.fixture(scope="module")
def ranks(
    tmp_path_factory: pytest.TempPathFactory,
    inputs: list,
    energy_one: Path,
    failed_sample: FailedSample,
) -> Ranks:
    """In this process: variance-compare, energy over step files, rollouts inspect; then one
    launch of 2 gloo ranks running those, energy, a fresh `rollouts sample`, the --resume of
    `failed_sample`'s failed run, and last two energy runs that must fail: an id outside the
    vocabulary in the last group (only the rank holding it finds it: the vocabulary is checked
    per share) and one group for 2 ranks."""
    base = tmp_path_factory.mktemp("dist")
    out = Ranks(
        energy_one, base / "e2", base / "v1", base / "v2", base / "s1", base / "s2",
        "", base / "sample2", base / "launch", base / "bad", base / "refused",
    )  # fmt: skip
    one_process("variance-compare", *inputs, *VARIANCE, "--out", out.variance_one)
    dumps = step_files(base / "dumps")
    one_process(*step_args(dumps), "--out", out.steps_one)
    inspect = ["rollouts", "inspect", str(inputs[3]), "--json"]
    one = runner.invoke(app, inspect)
    assert one.exit_code == 0, one.output
    commands = {
        "energy": ["energy", *inputs, "--out", out.energy_two],
        "variance": ["variance-compare", *inputs, *VARIANCE, "--out", out.variance_two],
        "steps": [*step_args(dumps), "--out", out.steps_two],
        "inspect": inspect,
        "sample": [*sample_args(base), "--verifier", "exact", "--out", out.sample_two],
        "resume": [*failed_sample.args, "--resume", "--out", failed_sample.two],
        "bad": ["energy", *energy_on(bad_rollouts(base / "bad.jsonl")), "--out", out.bad],
        "refused": ["energy", *energy_on(reduced(base / "one.jsonl", 1, 2)), "--out", out.refused],
    }
    failing = {"bad": 2, "refused": 2}
    out.launch.mkdir()
    listed = base / "commands.json"
    listed.write_text(json.dumps({k: [str(a) for a in v] for k, v in commands.items()}))
    result = torchrun(2, out.launch, listed, script=Path(__file__).parent / "torchrun_commands.py")
    assert result.returncode == 0, result.stderr[-3000:]
    for r in (0, 1):
        codes = json.loads((out.launch / f"rank{r}.json").read_text())["codes"]
        assert codes == {**dict.fromkeys(commands, 0), **failing}, (r, codes, result.stderr[-3000:])
    return replace(out, inspect_one=one.stdout)


@pytest.mark.torchrun
def test_energy_two_ranks_write_what_one_process_writes(ranks: Ranks) -> None:
    one, two = ranks.energy_one, ranks.energy_two
    assert sorted(p.name for p in one.iterdir()) == sorted(p.name for p in two.iterdir())
    tokens = pd.read_parquet(one / "tokens.parquet")
    assert_frames_close(tokens, pd.read_parquet(two / "tokens.parquet"))
    for name in ("sequences.csv", "groups.csv"):
        assert_frames_close(pd.read_csv(one / name), pd.read_csv(two / name))
    p1, p2 = (json.loads((d / "proxies.json").read_text()) for d in (one, two))
    for b in p1:
        for k in p1[b]:
            assert p2[b][k] == pytest.approx(p1[b][k], rel=1e-4), (b, k)


@pytest.mark.torchrun
def test_energy_summary_records_each_ranks_tokens(ranks: Ranks) -> None:
    tokens = pd.read_parquet(ranks.energy_one / "tokens.parquet")
    summary = json.loads((ranks.energy_two / "summary.json").read_text())["distributed"]
    assert summary["world_size"] == 2 and sum(summary["rank_tokens"]) == len(tokens)
    assert min(summary["rank_tokens"]) > 0
    assert json.loads((ranks.energy_one / "summary.json").read_text())["distributed"] == {
        "world_size": 1,
        "rank_tokens": [len(tokens)],
    }


@pytest.mark.torchrun
def test_variance_two_ranks_write_what_one_process_writes(ranks: Ranks) -> None:
    one, two = ranks.variance_one, ranks.variance_two
    assert sorted(p.name for p in one.iterdir()) == sorted(p.name for p in two.iterdir())
    variance = pd.read_csv(one / "variance.csv")
    assert set(variance["mode"]) == {"proxy", "head", "full"}
    assert set(variance["group_size"]) == {2, 4}
    # The same seeded draws over the same pool: equal to float tolerance, mode by mode.
    assert_frames_close(variance, pd.read_csv(two / "variance.csv"), rtol=1e-4)
    # Rank correlations jump at near-ties of the true norms: a looser tolerance.
    assert_frames_close(pd.read_csv(one / "fidelity.csv"), pd.read_csv(two / "fidelity.csv"), 1e-3)
    assert json.loads((two / "summary.json").read_text())["distributed"]["world_size"] == 2


def step_files(folder: Path) -> Path:
    """verl-style dumps `1.jsonl`..`3.jsonl` (a step per file), each with groups `g0` and `g1`
    (so the names are qualified by file, `2/g0`) of 4 responses from different groups of the
    embedded rollouts, each carrying the trainer's advantage `R - mean_group(R)`."""
    by_group: dict[str, list[dict]] = {}
    for line in DEFAULT_ROLLOUTS.read_text(encoding="utf-8").splitlines():
        row = json.loads(line)
        by_group.setdefault(row["group"], []).append(row)
    sources = iter(list(by_group.values()))
    folder.mkdir()
    for step in (1, 2, 3):
        rows = []
        for g in range(2):
            members = next(sources)[:4]
            mean = sum(r["reward"] for r in members) / len(members)
            rows += [
                {**r, "group": f"g{g}", "step": step, "trainer_advantage": r["reward"] - mean}
                for r in members
            ]
        (folder / f"{step}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return folder


@pytest.mark.torchrun
def test_energy_over_step_files_with_steps_and_audit_under_torchrun(ranks: Ranks) -> None:
    """A directory of step files, `--steps 2-3` and the advantage audit against `otb` (whose
    baseline needs each rank's w): 2 gloo ranks write what 1 process writes, and the audit
    (its gaps, sizes and worst response) is the same."""
    one, two = ranks.steps_one, ranks.steps_two
    assert sorted(p.name for p in one.iterdir()) == sorted(p.name for p in two.iterdir())
    for name in ("sequences.csv", "groups.csv"):
        assert_frames_close(pd.read_csv(one / name), pd.read_csv(two / name))
    tokens = pd.read_parquet(one / "tokens.parquet")
    assert_frames_close(tokens, pd.read_parquet(two / "tokens.parquet"))
    assert sorted(set(tokens["group"])) == ["2/g0", "2/g1", "3/g0", "3/g1"]  # step 1 left out
    s1, s2 = (json.loads((d / "summary.json").read_text()) for d in (one, two))
    a1, a2 = s1["advantage_audit"], s2["advantage_audit"]
    assert (a1["baseline"], a1["responses"], a1["tokens"]) == ("otb", 16, len(tokens))
    assert not a1["agrees"]  # R - mean is not the energy-weighted otb baseline
    close = ("max_abs_diff", "mean_abs_diff", "tolerance")  # from each rank's own w
    for key in close:
        assert a2[key] == pytest.approx(a1[key], rel=1e-4), key
    same = [k for k in a1 if k not in close]  # the worst response's number included
    assert [a2[k] for k in same] == [a1[k] for k in same] and set(a2) == set(a1)
    assert s2["totals"] == s1["totals"] and s2["distributed"]["world_size"] == 2
    assert len(s1["inputs"]["rollouts"]["files"]) == 3


def test_device_map_auto_gives_the_same_energy(
    inputs: list, energy_one: Path, tmp_path: Path
) -> None:
    """accelerate's dispatch (here onto the CPU) measures what a plain load measures."""
    one_process("energy", *inputs, "--device-map", "auto", "--out", tmp_path / "mapped")
    assert_frames_close(
        pd.read_parquet(energy_one / "tokens.parquet"),
        pd.read_parquet(tmp_path / "mapped" / "tokens.parquet"),
    )


@pytest.mark.torchrun
def test_inspect_under_torchrun_prints_what_one_process_prints(ranks: Ranks) -> None:
    two = (ranks.launch / "inspect.rank0.out").read_text()
    assert json.loads(two) == json.loads(ranks.inspect_one)
    assert json.loads(two)["rows"] == GROUPS * PER_GROUP
    assert (ranks.launch / "inspect.rank1.out").read_text() == ""  # rank 0 alone prints


@pytest.mark.torchrun
@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="thread names from Linux /proc")
def test_leaving_the_session_stops_gloos_threads(ranks: Ranks) -> None:
    """After `session()` the process group is gone, gloo's threads with it, even when a model was
    loaded inside (transformers then imports torch.distributed.fsdp, whose default argument
    `dist.group.WORLD` would hold a group made before it): threads left for interpreter teardown
    once aborted a rank in CI after its work was done. (The ranks' thread names are written by
    torchrun_commands.py after the session that ran the commands.)"""
    threads = {
        r: json.loads((ranks.launch / f"rank{r}.json").read_text())["threads"] for r in (0, 1)
    }
    assert all(names and not any("gloo" in n for n in names) for names in threads.values()), threads


def energy_on(rollouts: Path) -> list[str | Path]:
    return ["--ckpt", default_checkpoint(), "--rollouts", rollouts]


def bad_rollouts(path: Path) -> Path:
    """2 groups of 2, the last response's ids outside the embedded vocabulary."""

    def plant(rows: list[dict]) -> None:
        rows[-1]["response_ids"] = [10_000] * len(rows[-1]["response_ids"])

    return reduced(path, 2, 2, plant)


@pytest.mark.torchrun
@pytest.mark.parametrize(
    ("name", "words"),
    [("bad", "outside the checkpoint's vocabulary"), ("refused", "2 ranks but only 1 group(s)")],
)
def test_a_ranks_own_bad_input_or_too_few_groups_stops_every_rank(
    ranks: Ranks, name: str, words: str
) -> None:
    """Both ranks exit 2 (the launch's records), rank 0 prints the paragraph once and rank 1
    nothing, no traceback, no output folder."""
    rank0, rank1 = ranks.err(name)
    assert rank0.count("otb-diag: error:") == 1 and words in rank0
    assert "otb-diag: error:" not in rank1
    assert "Traceback" not in rank0 + rank1
    assert not getattr(ranks, name).exists()


@pytest.mark.parametrize("command", ["energy", "variance-compare"])
def test_device_auto_is_the_default_in_help(command: str) -> None:
    result = runner.invoke(app, [command, "--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0
    line = next(x for x in result.output.splitlines() if "--device " in x or "--device T" in x)
    assert "auto" in line
    assert "default: auto" in " ".join(result.output.split())


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
@pytest.mark.parametrize(
    ("option", "value", "words"),
    [
        ("--device", "cuda", "no CUDA device"),
        ("--device", "tpu", "unknown device"),
        ("--device-map", "cuda:3,cpu", "no CUDA device"),
    ],
)
def test_missing_device_is_bad_input(option: str, value: str, words: str, tmp_path: Path) -> None:
    out = tmp_path / "out"
    result = runner.invoke(app, ["energy", option, value, "--out", str(out), "--quiet"])
    assert result.exit_code == 2
    assert words in result.output and "Traceback" not in result.output
    assert not out.exists()


@pytest.mark.parametrize("interrupt", [KeyboardInterrupt, SystemExit])
def test_interrupted_run_leaves_nothing(tmp_path: Path, interrupt: type[BaseException]) -> None:
    out = tmp_path / "out"
    with pytest.raises(interrupt), staged_output(out) as stage:
        (stage / "tokens.parquet").write_text("half")
        raise interrupt()
    assert not out.exists()
    out.mkdir()
    (out / "old.txt").write_text("kept")
    with pytest.raises(interrupt), staged_output(out) as stage:
        (stage / "sequences.csv").write_text("half")
        raise interrupt()
    assert [p.name for p in out.iterdir()] == ["old.txt"]


_KILLED_WRITER = """
import os, signal, sys
from otb_diag.io.atomic import staged_output
with staged_output(sys.argv[1]) as stage:
    (stage / "tokens.parquet").write_text("half")
    os.kill(os.getpid(), signal.SIGKILL)  # no clean-up runs
"""


def test_the_next_run_removes_a_killed_runs_staging(tmp_path: Path) -> None:
    """SIGKILL leaves the hidden staging directory; the next run into `--out` removes it, but
    not one of a live process, of another machine, or not of ours."""
    out = tmp_path / "out"
    killed = subprocess.run([sys.executable, "-c", _KILLED_WRITER, str(out)], check=False)
    assert killed.returncode == -9
    (left,) = out.glob(".otb-diag-staging-*")
    assert (left / "tokens.parquet").exists()
    host = left.name.removeprefix(".otb-diag-staging-").split("-")[0]
    kept = [
        out / f".otb-diag-staging-{host}-{os.getpid()}-live",  # this process: alive
        out / f".otb-diag-staging-{host}x-999999999-other",  # another machine's name
        out / ".otb-diag-staging-olderformat",
    ]
    for folder in kept:
        folder.mkdir()
    with staged_output(out) as stage:
        (stage / "tokens.parquet").write_text("whole")
    assert not left.exists()
    assert sorted(out.iterdir()) == sorted([*kept, out / "tokens.parquet"])
    assert (out / "tokens.parquet").read_text() == "whole"


def test_shards_are_balanced_and_cover_every_group() -> None:
    sizes = [50, 10, 40, 30, 20, 5, 5]
    shards = shard_by_tokens(sizes, 3)
    assert sorted(i for s in shards for i in s) == list(range(len(sizes)))
    assert all(s == sorted(s) for s in shards)
    totals = [sum(sizes[i] for i in s) for s in shards]
    assert max(totals) - min(totals) <= max(sizes)  # greedy largest-first bound
    assert totals == [55, 55, 50]  # 50+5 | 40+10+5 | 30+20, by hand


def test_combined_proxies_equal_the_whole_batch() -> None:
    g = torch.Generator().manual_seed(0)
    adv = torch.randn(10, 6, generator=g)
    w = torch.rand(10, 6, generator=g)
    mask = (torch.rand(10, 6, generator=g) > 0.3).float()
    mask[3] = 0  # a sequence with nothing generated counts as a row, as in verl
    whole = variance_proxies(adv, mask, w)
    parts = [
        (variance_proxies(adv[s], mask[s], w[s]), len(mask[s])) for s in (slice(0, 4), slice(4, 10))
    ]
    combined = combine_proxies(parts)
    for k, v in whole.items():
        assert combined[k] == pytest.approx(v, rel=1e-5)


SAMPLE_PROMPTS = ["C:684=", "R:096=", "S:2753=", "C:12=", "R:31415=", "S:90="]


def sample_args(folder: Path) -> list[str | Path]:
    """`rollouts sample` of 4 responses to each of `SAMPLE_PROMPTS` (written into `folder`)."""
    prompts = folder / "prompts.jsonl"
    rows = [{"prompt": p, "answer": p[2:-1]} for p in SAMPLE_PROMPTS]
    prompts.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    common = ["rollouts", "sample", "--ckpt", default_checkpoint(), "--prompts", prompts]
    return [*common, "--n", "4", "--max-new-tokens", "12", "--batch-tokens", "60"]


VERIFIER = """
import os


def fn(prompt, response, answer):
    if FAIL and os.environ.get("RANK") == "1":
        raise ValueError("planted on rank 1")
    return float(response.strip() == answer)
"""


@dataclass(frozen=True)
class FailedSample:
    """`rollouts sample` (`args`) in this process into `one`, then on 2 gloo ranks into `two`
    with a verifier failing on rank 1 only: that launch's result, whether it wrote
    rollouts.jsonl, and how many parts it left (half of which were then removed and the
    verifier made to pass, for the `resume` command of the `ranks` launch)."""

    args: list[str | Path]
    one: Path
    two: Path
    failed: subprocess.CompletedProcess
    written: bool
    parts: int


@pytest.fixture(scope="module")
def failed_sample(tmp_path_factory: pytest.TempPathFactory) -> FailedSample:
    base = tmp_path_factory.mktemp("sample")
    common = [*sample_args(base), "--quiet"]
    verifier = base / "verifier.py"  # the same name throughout: --resume checks it
    common += ["--verifier", f"{verifier}:fn"]
    verifier.write_text("FAIL = False\n" + VERIFIER, encoding="utf-8")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as each rank (OMP_NUM_THREADS=1): the same float arithmetic
    try:
        one_process(*common, "--out", base / "one")
    finally:
        torch.set_num_threads(threads)

    verifier.write_text("FAIL = True\n" + VERIFIER, encoding="utf-8")
    out = base / "two"
    failed = torchrun(2, *common, "--out", out)
    written = (out / "rollouts.jsonl").exists()
    parts = sorted((out / ".sample-parts").glob("part-*.jsonl"))
    for part in parts[::2]:
        part.unlink()
    verifier.write_text("FAIL = False\n" + VERIFIER, encoding="utf-8")
    return FailedSample(common, base / "one", out, failed, written, len(parts))


@pytest.mark.torchrun
def test_sample_two_ranks_write_the_pools_of_one_process_and_resume(
    failed_sample: FailedSample, ranks: Ranks
) -> None:
    """`rollouts sample` on 2 gloo ranks: byte-identical rollouts.jsonl and the same manifest
    as one process; a verifier failing on rank 1 only stops both (exit 2, nothing written, the
    parts kept), and --resume under torchrun, after half the parts are removed, finishes them
    (the `ranks` launch's `resume`, which exited 0 on both ranks)."""
    failed = failed_sample.failed
    assert failed.returncode != 0
    assert "exitcode  : 2" in failed.stderr  # torchrun's report of the first failed rank
    assert failed.stderr.count("otb-diag: error:") == 1
    assert "planted on rank 1" in failed.stderr and "line " in failed.stderr
    assert not failed_sample.written
    assert failed_sample.parts >= 4  # every batch was sampled, by both ranks

    one, out = failed_sample.one, failed_sample.two
    assert (out / "rollouts.jsonl").read_bytes() == (one / "rollouts.jsonl").read_bytes()
    assert not (out / ".sample-parts").exists()
    m1, m2 = (json.loads((d / "manifest.json").read_text()) for d in (one, out))
    for m in (m1, m2):
        for varying in ("seconds", "sampled_tokens_this_run", "distributed"):
            m.pop(varying)
    assert m1 == m2


@pytest.mark.torchrun
def test_sample_two_ranks_fresh_run_splits_the_work(ranks: Ranks) -> None:
    manifest = json.loads((ranks.sample_two / "manifest.json").read_text())
    tokens = manifest["distributed"]["rank_tokens"]
    assert manifest["distributed"]["world_size"] == 2 and min(tokens) > 0
    assert sum(tokens) == manifest["generated_tokens"]
    assert "sampling, 2 ranks" in ranks.err("sample")[0]  # rank 0's bar, said to cover both
