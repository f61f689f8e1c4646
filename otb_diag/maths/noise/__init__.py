"""The gradient noise scale and the budget read off it (docs/theory.md, docs/noise-scale.md):
the split of a batch's noise within and between prompts and the noise scale with its interval
(`noise_scale`), the knee and the recommendation (`knee`), the same split from one training
step's own groups (`step_split`), pooled over a run's steps (`pooling`, fed by metric name
through `budget_stream`, a log's values checked first by `split_checks`), and the two-batch
estimate of all parameters under data parallelism (`two_batch`)."""
