"""`otb-diag regress`: the comparison with a golden file (`recipe`) and the flat metrics of a
run directory (`run_metrics`)."""
