"""The `otb-diag` command line: a thin Typer layer over `otb_diag`."""
