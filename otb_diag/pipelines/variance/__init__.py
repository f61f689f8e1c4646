"""`otb-diag variance-compare`: the recipe (`recipe`) and each rank's measuring of statistics,
scores and fidelity (`measure`)."""
