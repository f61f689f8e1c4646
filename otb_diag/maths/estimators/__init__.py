"""maths/estimators: see ARCHITECTURE.md."""
