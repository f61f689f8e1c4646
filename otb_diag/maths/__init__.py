"""Pure maths over tensors: the formulas of docs/theory.md, one idea per module, no file ever
read or written. Per-token statistics from logits (`token_stats`), returns (`returns`), per-group
segment sums (`groups`), the baseline registry (`baselines`) and aggregation modes
(`aggregation`), verl's variance proxies (`proxies`), per-token score vectors (`scores`; for
`full` mode the seeded `directions`, the engines `scores_forward` (jvp) and `scores_reverse`
(vjp), and their cost model `full_cost`), the empirical variance study (`variance`, its
statistics `variance_stats`, per-block and sub-sketch reads `coordinate_variance`), energy
tables (`energy`), within-group heterogeneity (`heterogeneity`), proxy fidelity (`fidelity`) and
the collapse rule (`collapse`). Tensors of a
batch of responses share the `[B, T]` layout of `response_batch`. Imports nothing from
`otb_diag` but `errors`."""
