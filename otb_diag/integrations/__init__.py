"""Inside the trainer: OTB diagnostics at every step of TRL's `GRPOTrainer` (`trl.attach`) and
verl's trainer step (`verl.compute_otb_metrics`), and the exact-id dumps both trainers lack
(`dump.py`). docs/live.md says how to use them. TRL and verl are imported only when called."""
