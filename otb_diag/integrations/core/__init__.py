"""The trainer-neutral core of the live diagnostics, which every trainer's adapter (`trl/`,
`verl/`, a plain loop) hands its steps to: `live_core.py:LiveCore` (gather, measure on a worker
thread, pool, watch, record), the step's metrics (`step_metrics.py`), which reach the dashboard
(`metric_levels.py`), the collapse watch (`collapse_watch.py`), the exact-id dumps
(`dump.py`), and log p and Σπ² caught while a model generates (`generation_stats.py`)."""
