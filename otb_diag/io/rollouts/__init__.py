"""io/rollouts: see ARCHITECTURE.md."""
