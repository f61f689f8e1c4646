"""Rollout files, read through one path (`stream`): the index pass (`stream.index_rollouts`)
scans the set (`scan`: the files `--rollouts` names, `sources`; `--steps`), each file's rows
validated into `Response`s (`readers`) from its raw records (`records`, a trainer's dump mapped
by `otb_diag/io/trainers/`), one row at a time (`rows`), with the physical checks of logged
probabilities (`probability_checks`); then chunks of groups (`stream.stream_chunks`) or the
whole set (`stream.read_set`); the `[B, T]` tensors (`to_batch`)."""
