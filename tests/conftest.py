"""Hypothesis runs derandomized by default, so CI sees the same examples on every run (the
project's determinism rule). `HYPOTHESIS_PROFILE=explore pytest` searches with fresh randomness
and more examples when hunting for new counterexamples."""

import os

import pytest
import torch
from hypothesis import settings

settings.register_profile("ci", derandomize=True, deadline=None)
settings.register_profile("explore", max_examples=500, deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


@pytest.fixture(params=[1, 2], ids=["threads=1", "threads=2"])
def torch_threads(request: pytest.FixtureRequest):
    """Run a numerically sensitive test under 1 and 2 intra-op threads: float32 reductions
    reorder with the thread count, and a tolerance must hold for both (issue 12)."""
    before = torch.get_num_threads()
    torch.set_num_threads(request.param)
    yield request.param
    torch.set_num_threads(before)
