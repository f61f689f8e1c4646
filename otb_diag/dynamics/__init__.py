"""dynamics: see ARCHITECTURE.md."""
