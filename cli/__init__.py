"""The `otb-diag` command line, installed as `otb_diag.cli` (the folder sits at the top of the
repository, as the design card asks): a thin Typer layer that parses options, calls
`otb_diag.pipelines`, prints and exits. No maths here."""
