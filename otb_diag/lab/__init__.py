"""The embedded toy lab: a verifiable digit task, a tiny GPT-2 trained on it, and its rollouts.

`otb_diag.lab.build.build_lab` rebuilds everything from a seed; the build shipped with the
package lives in `lab/default/` (see `otb_diag.io.scenarios`).
"""
