"""pipelines/report: see ARCHITECTURE.md."""
