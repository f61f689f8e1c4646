"""runtime: see ARCHITECTURE.md."""
