"""Input and output at the edges: rollout files (`rollouts`, one raw row in `rollout_rows`),
Hugging Face checkpoints (`checkpoint`), training logs of verl, TRL and our trainer
(`training_logs`), rollouts into `[B, T]` tensors (`batch`), what the commands load (`inputs`),
atomic writes (`atomic`), hashes and versions for provenance (`provenance`) and the embedded
default's paths (`defaults`). May use `maths` for tensor layouts; never the pipelines."""
