"""TRL's files.

Completion logs: `GRPOTrainer` with `log_completions=True` writes, at every logging step,
`output_dir/completions/completions_{step:05d}.parquet` with the columns `step`, `prompt`,
`completion`, one column per reward function (named after it), any `log_extra` columns, and
`advantage` (the trainer's advantage of each completion, one number per completion). Prompts
and completions are text, or lists of `{role, content}` messages for conversational data; the
text was decoded with `skip_special_tokens=True`.

Each record becomes a row of the project's format (`trl_record`): a group is one (step, prompt)
pair, the response is `completion`, the reward is the sum of the reward-function columns (TRL's
`reward_weights` default to 1; a function returning None is NaN and left out of the sum, as
TRL's `nansum` does) unless `reward_columns` names the ones to sum, and `advantage` is kept as
`trainer_advantage`. Reward-function columns are told apart from extra columns by being
numeric; `--reward-column` settles any doubt.

Training logs: a `trainer_state.json` (one JSON object with a `log_history` list,
`trainer_state`): the entries that carry `grad_norm`; score from `reward`, else the sum of the
`rewards/<fn>/mean` (or older `rewards/<fn>`) keys (`REWARD_KEY`), which is how TRL's `reward`
is formed with unit weights; length from `completions/mean_length` or `completion_length`;
`tokens_sampled` from `num_tokens` (TRL's running count of prompt and completion tokens seen).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Sequence
from typing import Any

from otb_diag.io.rollouts.rows import KEYS
from otb_diag.io.trainers.trainer import Fail, Trainer

_NOT_REWARDS = {"step", "prompt", "completion", "advantage", "image", "images"}
# A reward function's key in `log_history`: `rewards/<fn>/mean` (older TRL: `rewards/<fn>`).
REWARD_KEY = re.compile(r"^rewards/[^/]+(/mean)?$")


def trl_record(
    record: dict[str, Any],
    reward_columns: Sequence[str] | None,
    fail: Fail,
) -> dict[str, Any]:
    """The record with `reward` (the summed reward columns) and text `prompt`/`completion`
    (the content of their messages when conversational; the prompt's messages are kept as
    `prompt_messages`). `fail(field, message, hint)` makes the error for this row."""
    out = dict(record)
    columns = list(reward_columns) if reward_columns else _reward_columns(record)
    if not columns:
        raise fail(
            "reward",
            "no reward-function column: expected a numeric column per reward function "
            f"(columns: {', '.join(map(str, record))}).",
            "Name the reward with --reward-column NAME.",
        )
    values = []
    for name in columns:
        if name not in record:
            raise fail(name, f"no column '{name}' (columns: {', '.join(map(str, record))}).", None)
        value = record[name]
        if value is None or (isinstance(value, float) and math.isnan(value)):
            continue  # a reward function that returned None: NaN, left out of TRL's nansum
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            raise fail(name, f"expected a number, got {type(value).__name__} {value!r:.40}.", None)
        values.append(float(value))
    if not values:
        raise fail(
            columns[0],
            f"every reward column ({', '.join(columns)}) is empty: TRL could not score this "
            "completion.",
            "Choose the reward with --reward-column NAME.",
        )
    out["reward"] = sum(values)
    for name in ("prompt", "completion"):
        if isinstance(record[name], list):
            out[name] = _message_text(record[name], name, fail)
    if isinstance(record["prompt"], list):
        out["prompt_messages"] = [
            {"role": str(m.get("role", "user")), "content": str(m.get("content", ""))}
            for m in record["prompt"]
        ]
    return out


def _reward_columns(record: dict[str, Any]) -> list[str]:
    return [
        key
        for key, value in record.items()
        if key not in _NOT_REWARDS
        and (value is None or (isinstance(value, (int, float)) and not isinstance(value, bool)))
    ]


def _message_text(messages: list[Any], field: str, fail: Fail) -> str:
    if not all(isinstance(m, dict) and isinstance(m.get("content"), str) for m in messages):
        raise fail(field, "expected text or a list of {role, content} messages.", None)
    return "".join(m["content"] for m in messages)


# What `attach` writes beside the trainer's log, in its `output_dir` (which holds
# trainer_state.json at the end, and a copy in each `checkpoint-<n>/`): every `otb/` metric of
# every measured step, one JSON line `{"step": s, ...}` each (`integrations/core/metric_levels.py`;
# read back by `io/training_logs.py`).
OTB_RECORD = "otb_metrics.jsonl"


def trainer_state(text: str) -> dict[str, Any] | None:
    """The parsed file when it is one JSON object with a `log_history` list, else None (a JSONL
    file: several objects, the first line one of them). One JSON document that does not parse,
    such as a trainer_state.json cut short, raises its `json.JSONDecodeError`, whose line is
    where it breaks."""
    if not text.lstrip().startswith("{"):
        return None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as err:
        try:
            json.loads(text.lstrip().split("\n", 1)[0])
        except json.JSONDecodeError:
            raise err from None  # not even its first line is an object: one document, broken
        return None  # several JSON objects: a JSONL file
    return data if isinstance(data, dict) and "log_history" in data else None


TRL = Trainer(
    name="trl",
    dump_signature=("step", "prompt", "completion"),
    dump_excludes=("input",),  # a verl dump with a `prompt` column is still verl's
    dump_keys={
        **KEYS,
        "group": ("uid",),  # TRL logs none: groups are (step, prompt)
        "response": ("completion",),
        "reward": ("reward",),
        "trainer_advantage": ("advantage",),
    },
    prepare=trl_record,
    dump_dir="completions",  # `output_dir/completions/` (GRPOConfig.log_completions)
    log_signature=(),  # recognised by `trainer_state`, not by a key
    log_keys={
        "step": ("step",),
        "grad_norm": ("grad_norm",),
        "score": ("reward",),
        "response_length": ("completions/mean_length", "completion_length"),
        "tokens_total": ("num_tokens",),
        # `otb_diag.integrations.trl.attach` logs the proxy under TRL's own estimator (grpo).
        "proxy2": ("otb/proxy/grpo/proxy2_total_power",),
    },
)
