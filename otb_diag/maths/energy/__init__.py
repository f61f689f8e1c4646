"""maths/energy: see ARCHITECTURE.md."""
