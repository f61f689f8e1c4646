"""`otb-diag energy`: the recipe (`recipe`), the chunked measuring loop (`stream`) and the
trainer-advantage audit chunk by chunk (`audit`)."""
