"""TRL's adapter: `attach(trainer)` on a `GRPOTrainer` or `RLOOTrainer` (`adapter.py`), which
trainers and TRL versions it takes (`support.py`), a step's rows put back together from the
micro-steps (`rows.py`), OTB's advantages in place of TRL's (`advantages.py`), the split's hidden
states caught from the loss forward (`split_capture.py`) and the all-parameter noise scale from
DDP's gradient all-reduce (`ddp_noise.py`). TRL is imported only when called."""

from otb_diag.integrations.trl.adapter import LIVE_ATTRIBUTE, LiveDiagnostics, attach

__all__ = ["LIVE_ATTRIBUTE", "LiveDiagnostics", "attach"]
