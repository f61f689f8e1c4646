"""pipelines/variance: see ARCHITECTURE.md."""
