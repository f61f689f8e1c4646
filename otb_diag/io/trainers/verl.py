"""verl's files.

Rollout dumps (`trainer.rollout_data_dir`, one `{step}.jsonl` per step): `input`, `output`,
`gts`, `score`, `step`, and `uid` when the batch has one (rows without it are grouped by
(step, input)). The `uid` comes in two forms (`prompt_uid`), checked against verl 0.9.1:
- the prompt's own (`RayPPOTrainer`, `trainer.use_v1=false`, verl ≤ 0.8's only trainer): a
  `uuid4` string, the same on every response of the prompt, as `fit` assigns it;
- V1's key `{uid}_{session}_{index}` (`verl/trainer/ppo/v1/trainer_base.py`, verl 0.9's
  default `trainer.use_v1=true`): `_log_rollout_data` writes the transfer queue's keys, one per
  response, sorted by `key.rsplit("_", 2)`; `session` is the response's number among the
  prompt's `rollout.n`, `index` the output's number within a multi-output agent loop.
Responses are grouped by the prompt's uid in both; a file that mixes the forms is refused, and
so is a second output of one session (a multi-output agent loop's outputs are turns of one
trajectory, not independent responses of the prompt).

Metrics logs, as JSONL (flat dicts or its file logger's `{"step": n, "data": {...}}` rows) or
CSV (a W&B export): `actor/grad_norm`, `critic/score/mean`, `response_length/mean`,
`variance_proxy/proxy{2,3}_*`, the step from `training/global_step`, `step`, `_step` or `Step`.
`perf/total_num_tokens` is the tokens of one step's batch (prompt + response,
`sum(batch.meta_info["global_token_num"])` in `compute_throughout_metrics`), summed into a
running total by `otb_diag/io/training_logs.py:read_training_log`.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Any

from otb_diag.errors import InputError
from otb_diag.io.rollouts.rows import KEYS
from otb_diag.io.trainers.trainer import Fail, Prepare, Trainer

# V1's transfer-queue key, as `agent_loop_tq.py` builds it: f"{uid}_{session_id}_{i}".
_V1_KEY = re.compile(r"(?P<session>(?P<uid>.+)_\d+)_(?P<index>\d+)")


def prompt_uid(uid: str) -> tuple[str, str | None]:
    """(the prompt's uid, the session `{uid}_{session}`) of a V1 key `{uid}_{session}_{index}`;
    (uid, None) for a prompt's own uid (V0's `uuid4`, which has no `_`)."""
    key = _V1_KEY.fullmatch(uid)
    return (key["uid"], key["session"]) if key else (uid, None)


class PromptUids:
    """Maps the uids of one dump file or batch, in order, to their prompts' uids
    (`prompt_uid`), refusing a mix of the two forms and two outputs of one session."""

    def __init__(self) -> None:
        self.first: tuple[str, str | None] | None = None  # the first uid and its session
        self.sessions: dict[str, str] = {}  # session -> the uid seen for it

    def __call__(self, uid: str, fail: Callable[[str, str | None], InputError]) -> str:
        """The prompt's uid of `uid`; `fail(message, hint)` makes the error for its row."""
        group, session = prompt_uid(uid)
        first, first_session = self.first = self.first or (uid, session)
        if (session is None) != (first_session is None):
            forms = {True: "a prompt's own uid", False: "verl V1's key {uid}_{session}_{index}"}
            raise fail(
                f"uid '{uid}' is {forms[session is None]}, but the first uid, '{first}', is "
                f"{forms[first_session is None]}: one dump holds one form, or responses of "
                "different prompts could share a group.",
                "Read the V0 (RayPPOTrainer) and V1 dumps as separate files.",
            )
        if session is not None and self.sessions.setdefault(session, uid) != uid:
            raise fail(
                f"uid '{uid}' is a second output of session '{session}' (after "
                f"'{self.sessions[session]}'): a multi-output agent loop wrote several outputs "
                "per sampled response, turns of one trajectory rather than responses of the "
                "prompt's group.",
                "Keep each session's final output only, as verl's GRPO advantage does "
                "(`compute_advantage_for_multi_trajectories`).",
            )
        return group


def _verl_record_mapper() -> Prepare:
    """A fresh mapper for one dump file: `uid` becomes the prompt's (`PromptUids`)."""
    uids = PromptUids()

    def prepare(record: dict[str, Any], _columns: Sequence[str] | None, fail: Fail) -> dict:
        if not isinstance(record.get("uid"), str):
            return record  # no uid (grouped by step and input) or a bad one (the row check says)
        return {**record, "uid": uids(record["uid"], lambda m, h: fail("uid", m, h))}

    return prepare


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
    prepare_file=_verl_record_mapper,
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
