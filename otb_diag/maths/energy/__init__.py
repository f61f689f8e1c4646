"""Per-token statistics and realized energy (docs/theory.md §2): the formulas from logits or
logged values (`token_stats`), verl's variance proxies (`proxies`), the heterogeneity of a
group's energy paths (`heterogeneity`) and the tables `otb-diag energy` writes (`tables`)."""
