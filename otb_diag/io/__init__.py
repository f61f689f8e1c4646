"""Input and output at the edges: rollout files (`rollouts/`, read through one path, the
streaming index), what each RL trainer writes (`trainers/`: verl, TRL), Hugging Face checkpoints
(`checkpoint`), what a command loads to measure (`loading`), training logs of verl, TRL and our
trainer (`training_logs`), the embedded scenarios' paths (`scenarios`), `tokens.parquet` written
by chunks (`token_file`), atomic writes (`atomic`) and provenance hashes (`provenance`)."""
