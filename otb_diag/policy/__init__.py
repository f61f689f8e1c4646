"""policy: see ARCHITECTURE.md."""
