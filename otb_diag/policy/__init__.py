"""Running the policy model: batched forward passes that turn a checkpoint and a
`ResponseBatch` into per-token statistics without ever holding `[B, T, V]` logits
(`forward_pass`), the surrogate loss whose gradient is the estimate ĝ (`surrogate_loss`), and
per-token score vectors (`scores/`)."""
