"""Pure maths over tensors: the formulas of docs/theory.md, one idea per module, no file ever
read or written and no model run. The `[B, T]` layout of a batch of responses
(`response_batch`), returns (`returns`), per-group segment sums (`groups`), aggregation modes
(`aggregation`); the baselines and the one estimator (`estimators/`); per-token statistics,
realized energy, verl's proxies and the energy tables (`energy/`); the empirical variance study
(`variance/`). Imports nothing from `otb_diag` but `errors`."""
