"""pipelines/inspect: see ARCHITECTURE.md."""
