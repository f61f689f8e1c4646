"""Rollout files: readers by suffix and the validated `Rollouts` (`readers`), one raw row and
its field aliases (`rows`), line or batch iterators (`records`), the Parquet column scan
(`scan`), directories, globs and `--steps` (`sources`), streaming by groups (`stream`), the
physical checks of logged probabilities (`probability_checks`), TRL completion logs
(`trl_completions`) and the `[B, T]` tensors (`to_batch`)."""
