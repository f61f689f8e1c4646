"""policy/scores: see ARCHITECTURE.md."""
