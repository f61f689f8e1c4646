"""Hypothesis runs derandomized by default, so CI sees the same examples on every run (the
project's determinism rule). `HYPOTHESIS_PROFILE=explore pytest` searches with fresh randomness
and more examples when hunting for new counterexamples."""

import os

from hypothesis import settings

settings.register_profile("ci", derandomize=True, deadline=None)
settings.register_profile("explore", max_examples=500, deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))
