"""verl's adapter: `compute_otb_metrics` and `BudgetTracker` over a verl batch, `dump_batch`
(`adapter.py`), and the split's scores formed in the actor workers' log-prob forward
(`scores.py`). verl is imported only when called."""

from otb_diag.integrations.verl.adapter import BudgetTracker, compute_otb_metrics, dump_batch
from otb_diag.integrations.verl.scores import OTBScores, enable_otb_scores

__all__ = ["BudgetTracker", "OTBScores", "compute_otb_metrics", "dump_batch", "enable_otb_scores"]
