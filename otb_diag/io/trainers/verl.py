"""verl's files.

Rollout dumps (`trainer.rollout_data_dir`, one `{step}.jsonl` per step): `input`, `output`,
`score`, `step`, and `uid` when the batch has one (rows without it are grouped by (step, input)).

Metrics logs, as JSONL (flat dicts or its file logger's `{"step": n, "data": {...}}` rows) or
CSV (a W&B export): `actor/grad_norm`, `critic/score/mean`, `response_length/mean`,
`variance_proxy/proxy{2,3}_*`, the step from `training/global_step`, `step`, `_step` or `Step`.
`perf/total_num_tokens` is the tokens of one step's batch (prompt + response,
`sum(batch.meta_info["global_token_num"])` in `compute_throughout_metrics`), summed into a
running total by `otb_diag/io/training_logs.py:read_training_log`.
"""

from __future__ import annotations

from otb_diag.io.rollouts.rows import KEYS
from otb_diag.io.trainers.trainer import Trainer

VERL = Trainer(
    name="verl",
    dump_signature=("input", "output", "score"),
    dump_excludes=(),
    dump_keys={
        **KEYS,
        "group": ("uid",),
        "prompt": ("input",),
        "response": ("output",),
        "reward": ("score",),
    },
    prepare=None,
    dump_dir=None,
    log_signature=("actor/grad_norm", "critic/score/mean", "critic/rewards/mean"),
    log_keys={
        "step": ("training/global_step", "step", "_step", "Step"),
        "grad_norm": ("actor/grad_norm",),
        "score": ("critic/score/mean", "critic/rewards/mean"),
        "response_length": ("response_length/mean",),
        "proxy2": ("variance_proxy/proxy2_total_power",),
        "proxy3": ("variance_proxy/proxy3_pure_noise",),
        "tokens_per_step": ("perf/total_num_tokens",),
    },
)
