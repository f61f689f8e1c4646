"""`--batch-tokens` and `--chunk-size` default to auto: the statistics pass's plan for the loaded
model (`stats_plan`: the CPU's fixed sizes, or what a CUDA device's free memory allows), and the
settings a run records hold the sizes it used."""

from __future__ import annotations

import pytest
from otb_diag.cli.main import app
from tiny import tiny_model
from typer.testing import CliRunner

from otb_diag.pipelines.energy.settings import EnergySettings
from otb_diag.pipelines.measure_knobs import planned
from otb_diag.pipelines.variance.settings import VarianceSettings
from otb_diag.policy.forward_pass import BATCH_TOKENS, STATS_CHUNK


@pytest.mark.parametrize("cls", [EnergySettings, VarianceSettings])
def test_auto_sizes_are_the_cpu_sizes_on_the_cpu_and_model_free(cls) -> None:
    assert (cls().batch_tokens, cls().chunk_size) == (None, None)
    for model in (tiny_model(), None):
        got = planned(cls(), model)
        assert (got.batch_tokens, got.chunk_size) == (BATCH_TOKENS, STATS_CHUNK)
        assert got == cls(batch_tokens=BATCH_TOKENS, chunk_size=STATS_CHUNK)


def test_auto_sizes_follow_the_free_memory_and_given_sizes_are_kept() -> None:
    model = tiny_model()  # V = 30, d = 16: 240 B a chunk row, 1 KiB a token
    # a quarter of 4 GiB each: 2^30 / 240 rows and 2^30 / 1 KiB tokens, capped at 4096 and 2^15
    got = planned(EnergySettings(), model, free_bytes=4 * 2**30)
    assert (got.batch_tokens, got.chunk_size) == (2**15, 4096)
    got = planned(EnergySettings(chunk_size=64), model, free_bytes=4 * 2**30)
    assert (got.batch_tokens, got.chunk_size) == (2**15, 64)
    given = VarianceSettings(batch_tokens=100, chunk_size=3)
    assert planned(given, model, free_bytes=4 * 2**30) is given


@pytest.mark.parametrize("name", ["energy", "variance-compare"])
def test_the_help_says_what_auto_means(name: str) -> None:
    result = CliRunner().invoke(app, [name, "--help"])
    text = " ".join(result.output.replace("│", " ").split())
    assert (
        f"planned from the device's free memory on CUDA (stats_plan), {BATCH_TOKENS} on the CPU"
        in text
    )
    assert f"(stats_plan), {STATS_CHUNK} on the CPU" in text


@pytest.mark.slow  # runs a command end to end (a real run: seconds)
def test_variance_compare_plans_the_statistics_pass_and_records_its_sizes(
    tmp_path, monkeypatch
) -> None:
    """Auto: the statistics pass takes the plan (here a pretend CUDA plan of 8 tokens a chunk
    and 64 a batch), summary.json records it, and the head mode keeps the fixed sizes it has
    always had."""
    import json

    import numpy as np
    from tiny import save_checkpoint

    from otb_diag.pipelines.inputs import Inputs
    from otb_diag.pipelines.variance import measure
    from otb_diag.pipelines.variance.recipe import run_variance
    from otb_diag.policy import forward_pass

    save_checkpoint(tmp_path / "ckpt", seed=3)
    rng = np.random.default_rng(1)
    rows = [
        {"group": g, "prompt_ids": [2 + g, 5], "reward": float(i % 2),
         "response_ids": rng.integers(2, 28, size=int(rng.integers(2, 8))).tolist()}
        for g in range(2) for i in range(4)
    ]  # fmt: skip
    pool = tmp_path / "pool.jsonl"
    pool.write_text("".join(json.dumps(r) + "\n" for r in rows))
    monkeypatch.setattr(forward_pass, "stats_plan", lambda model, free_bytes=None: (8, 64))
    seen = {}
    for name in ("checkpoint_stats", "token_scores"):
        real = getattr(measure, name)

        def spy(*args, _real=real, _name=name, **kwargs):
            seen[_name] = (kwargs["batch_tokens"], kwargs["chunk_size"])
            return _real(*args, **kwargs)

        monkeypatch.setattr(measure, name, spy)
    settings = VarianceSettings(modes=("proxy", "head"), draws=5, bootstrap=10, sketch_dim=4)
    result = run_variance(
        Inputs(ckpt=[tmp_path / "ckpt"], rollouts=pool), tmp_path / "out", settings, progress=False
    )
    assert seen == {"checkpoint_stats": (64, 8), "token_scores": (BATCH_TOKENS, STATS_CHUNK)}
    recorded = json.loads((tmp_path / "out" / "summary.json").read_text())["settings"]
    assert (recorded["batch_tokens"], recorded["chunk_size"]) == (64, 8)
    assert (result.settings.batch_tokens, result.settings.chunk_size) == (64, 8)
