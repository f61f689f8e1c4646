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
    # a quarter of 4 GiB each: 2^30 / 240 rows and 2^30 / 1 KiB tokens, capped at 8192 and 2^17
    got = planned(EnergySettings(), model, free_bytes=4 * 2**30)
    assert (got.batch_tokens, got.chunk_size) == (2**17, 8192)
    got = planned(EnergySettings(chunk_size=64), model, free_bytes=4 * 2**30)
    assert (got.batch_tokens, got.chunk_size) == (2**17, 64)
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
