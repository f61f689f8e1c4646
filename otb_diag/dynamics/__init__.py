"""Rules over training-log tables (docs/theory.md §5), pure pandas: the collapse and variance-
warning rule (`collapse`) and the learning-rate sweep's verdicts (`lr_sweep`)."""
