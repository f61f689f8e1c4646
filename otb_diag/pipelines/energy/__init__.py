"""pipelines/energy: see ARCHITECTURE.md."""
