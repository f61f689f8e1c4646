"""Baselines and the estimator built on them: the registry (`registry.py`), the sequence-level
baselines (`baselines.py`) and the Optimal Token Baseline (`otb.py`), which register on import
here, the one estimator every command calls (`advantages.py`) and the trainer audit."""

from otb_diag.maths.estimators import baselines, otb  # noqa: F401  (register the built-ins)
