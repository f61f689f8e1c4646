"""maths/variance: see ARCHITECTURE.md."""
