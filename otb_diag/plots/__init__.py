"""Figures, paper style: tidy tables (pandas) in, a matplotlib Figure out. `style` holds the one
palette, sizes and the atomic PNG + PDF writer; `energy` draws the paper's figures 3–5,
`variance` the variance-against-N, ratio and proxy-fidelity figures, `dynamics` figures 1–2.
No maths beyond what a plot needs; depends on `maths` and `io.atomic` only."""
