"""`otb-diag rollouts inspect`: the recipe (`recipe`) and the per-row facts it summarises
(`facts`)."""
