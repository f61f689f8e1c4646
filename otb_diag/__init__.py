"""otb-diag: gradient-variance diagnostics for RL of language models."""

__version__ = "0.1.0"
