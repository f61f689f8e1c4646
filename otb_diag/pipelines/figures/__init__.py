"""`otb-diag figures`: the whole figure set of a scenario (`recipe`) and the worker processes
that run its trainings (`training_pool`)."""
