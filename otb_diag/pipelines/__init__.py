"""One recipe per command, read top to bottom: load (`io`), compute (`maths`, `policy`), draw
(`plots`), write atomically, return a summary. A command with several modules has a folder
whose `recipe` is the entry point: `inspect/`, `energy/`, `variance/`, `report/`, `regress/`,
`figures/`, `training_logs/` (`dynamics`); `rl_training` (online RL on the toy task) is one
module. No
formula lives here; the CLI calls these functions and nothing below them."""
