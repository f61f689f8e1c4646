"""The empirical policy-gradient variance (docs/theory.md §4): paired draws of groups from each
prompt's pool and the estimate of every baseline on them (`paired_draws`), bootstrap intervals
and the equivalent group size (`intervals`), per-block variances and the projection error
(`blocks`), and how well the proxy ranks the true per-token norms (`fidelity`)."""
