"""pipelines/regress: see ARCHITECTURE.md."""
