"""One module per command, read top to bottom like a recipe: load (`io`), compute (`maths`), draw
(`plots`), write. `inspect` (rollouts inspect), `energy`, `variance` (variance-compare),
`dynamics`, `train` (toy online RL), `figures` (the whole figure set), `regress` with
`run_metrics` (golden-file regression). No formula lives here; the CLI calls these functions
and nothing below them."""
