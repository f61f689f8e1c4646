"""`otb-diag dynamics`: training logs in; collapse, lead time, the pooled split and the
comparison of arms out (`recipe`; what it reads and its knobs, `settings`)."""
