"""pipelines/figures: see ARCHITECTURE.md."""
