"""Per-token score vectors `s_t = ∇_θ log π(y_t)` projected to k dimensions (docs/theory.md §4):
the modes `proxy`, `head` and `full` (`token_scores`); for `full`, the seeded per-parameter
directions (`directions`), the forward-mode engine (`forward_mode`, with the query-chunked
attention of `chunked_attention`), the reverse-mode engine (`reverse_mode`) and the cost model
that picks between them (`cost`)."""
