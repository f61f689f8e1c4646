"""Hypothesis runs derandomized by default, so CI sees the same examples on every run (the
project's determinism rule). `HYPOTHESIS_PROFILE=explore pytest` searches with fresh randomness
and more examples when hunting for new counterexamples.

The session fixtures `reduced_rollouts` and `runs` are small real runs shared by the modules that
read run outputs (regress, report).

This module imports no model stack at its top (torch, transformers, matplotlib: the fixtures
below import them where they are used): under `make test` it is also imported by pytest-xdist's
controlling process, which runs no test, and there those imports were seconds of the start-up's
two busy cores."""

import gc
import os
import shutil
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from filelock import FileLock
from real_model import smollm2_converted, smollm2_gguf

# The suite's processes write the modules they compile to the (gitignored) __pycache__ folders,
# also where PYTHONDONTWRITEBYTECODE is set (as on our development machines): otherwise each
# pytest worker compiles otb_diag and rewrites every test module's asserts again at every run
# (a third of a worker's collection), and every process a test starts (torchrun's ranks, the
# live core's worker, a bench script's child) compiles otb_diag again. Those read the cache.
sys.dont_write_bytecode = False


def pytest_configure(config: pytest.Config) -> None:
    """Hypothesis's profile (the module's docstring), loaded before any test module imports
    Hypothesis (imported here, after the line above: pytest rewrites the asserts of Hypothesis's
    modules too, and caches them now).

    `make test` runs two pytest-xdist workers on CI's 2 cores: each keeps torch (and the
    processes its tests start) to one intra-op thread, since two processes of 2 threads each on
    2 cores ran 13x slower than one thread each. A plain `pytest` keeps torch's default."""
    from hypothesis import settings

    settings.register_profile("ci", derandomize=True, deadline=None)
    settings.register_profile("explore", max_examples=500, deadline=None)
    settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))
    if os.environ.get("PYTEST_XDIST_WORKER"):
        import torch

        torch.set_num_threads(1)
        os.environ["OMP_NUM_THREADS"] = "1"


def pytest_collection_finish(session: pytest.Session) -> None:
    """Every test module is imported: what exists now (modules, classes, functions of torch,
    transformers, TRL ...) lives to the end, so the cyclic collector stops visiting it
    (`gc.freeze`). A full collection then walks only what the tests make: accelerate runs one
    at every `Trainer.train()` (`clear_device_cache`), ~0.3 s each over the imported stack."""
    gc.freeze()


@pytest.fixture(params=[1, pytest.param(2, marks=pytest.mark.slow)], ids=["threads=1", "threads=2"])
def torch_threads(request: pytest.FixtureRequest):
    """Run a numerically sensitive test under 1 and 2 intra-op threads: float32 reductions
    reorder with the thread count, and a tolerance must hold for both (issue 12). The 2-thread
    runs are marked slow (on 2 busy cores they are most of the numerical tests' time): `make
    test` runs both, `make test-fast` 1 thread only."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(request.param)
    yield request.param
    torch.set_num_threads(before)


def built_once(factory: pytest.TempPathFactory, name: str, build: Callable[[Path], None]) -> Path:
    """`build(folder)` run once per pytest session, also across the xdist workers of `make
    test`: the first worker to ask builds it under a lock in the session's shared temporary
    folder, the others wait and read it (a read-only input, so one copy serves every worker)."""
    base = factory.getbasetemp()
    folder = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / name
    with FileLock(f"{folder}.lock"):
        if not (folder / ".built").exists():
            shutil.rmtree(folder, ignore_errors=True)
            folder.mkdir()
            build(folder)
            (folder / ".built").touch()
    return folder


@pytest.fixture(autouse=True)
def _figures_drawn_not_rendered(request: pytest.FixtureRequest) -> Iterator[None]:
    """Every test's figures are drawn, their files written empty (tests/unwritten_figures.py):
    rendering PNG and PDF is most of a small run's time. A test marked `renders` (it reads the
    images, their fonts or their bytes) gets them rendered. Module and session fixtures are set
    up before this one, so a fixture that runs a command wraps it in `unwritten_figures` itself
    (rendering what a test reads: `runs`' PNGs, which the report embeds)."""
    from unwritten_figures import unwritten_figures

    if request.node.get_closest_marker("renders"):
        yield
        return
    with unwritten_figures():
        yield


@pytest.fixture(scope="session")
def reduced_rollouts(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """4 groups x 12 responses of the embedded rollouts (tests/small_runs.py)."""
    from small_runs import reduce_rollouts

    folder = built_once(
        tmp_path_factory, "reduced", lambda f: reduce_rollouts(f / "rollouts.jsonl")
    )
    return folder / "rollouts.jsonl"


@pytest.fixture(scope="session")
def runs(tmp_path_factory: pytest.TempPathFactory, reduced_rollouts: Path) -> Path:
    """energy/ and variance/ run directories of the reduced default (seed 0); read-only. Their
    PNGs are rendered (the report embeds them), their PDFs drawn and written empty."""
    from small_runs import run_energy, run_variance
    from unwritten_figures import unwritten_figures

    def build(root: Path) -> None:
        with unwritten_figures(rendered=("png",)):
            run_energy(reduced_rollouts, root / "energy")
            run_variance(reduced_rollouts, root / "variance")

    return built_once(tmp_path_factory, "runs", build)


HEAVY = ("slow", "torchrun", "external")  # the markers of the tests that take seconds


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """A test that reads SmolLM2 may download it (pip, the network): marked `external` here, by
    the fixture it uses (`smollm2`, `smollm2_fp32`), so no module has to remember it.

    Then the modules holding a heavy test (`HEAVY`) go first, each kept whole and in its
    order: pyproject's `--dist loadfile` gives a whole module to one worker (its module
    fixtures, a torchrun launch among them, are built once; split across the two workers,
    test_torchrun's launch ran on both), the next module to whichever worker finishes first,
    so the many short modules last even out the two workers' ends."""
    for item in items:
        if any(name.startswith("smollm2") for name in getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.external)
    heavy = {module(item) for item in items if any(item.get_closest_marker(m) for m in HEAVY)}
    items.sort(key=lambda item: module(item) not in heavy)  # stable: order kept within


def module(item: pytest.Item) -> str:
    """The file of a test's node id (xdist's `loadfile` unit)."""
    return item.nodeid.split("::")[0]


@pytest.fixture(scope="session")
def smollm2() -> Path:
    """SmolLM2-135M-Instruct as a .gguf file (tests/real_model.py): downloaded once, cached."""
    return smollm2_gguf()


@pytest.fixture(scope="session")
def smollm2_fp32() -> Path:
    """SmolLM2-135M-Instruct as a float32 checkpoint directory (tests/real_model.py), converted
    from the .gguf once and cached: a load without the GGUF reader's de-quantization."""
    return smollm2_converted()
