"""`otb-diag train`: online policy-gradient RL on the toy lab task, on CPU."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from otb_diag.cli.common import note, show
from otb_diag.cli.options import CKPT, JSON, OUT_DIR, QUIET, command

from otb_diag.io.scenarios import scenario_knob
from otb_diag.knobs import knob
from otb_diag.pipelines.train_settings import TrainSettings


@dataclass(frozen=True)
class TrainRun:
    ckpt: list[Path] | None = knob(None, CKPT)
    max_new_tokens: int | None = knob(
        None, help="Longest response sampled. Default: the scenario's (default 64, long 400)."
    )
    out: Path = knob(Path("otb-train"), OUT_DIR)
    as_json: bool = knob(False, JSON)
    quiet: bool = knob(False, QUIET)
    scenario: str = scenario_knob()


@command
def train(run: TrainRun, settings: TrainSettings) -> None:
    """Policy-gradient RL on a lab task from a lab checkpoint: the scenario's prompts (default:
    copy / reverse / sort digits; long: running sums with a scratchpad) with fresh digits.

    Each step draws --prompts-per-step prompts, samples --group-size responses per prompt, scores
    them with the verifier, computes w and the --baseline advantages A with the same code as
    `otb-diag energy`, and takes one AdamW step on the surrogate
    L = −Σ c·A·log π(y_t) (c: the --aggregation weights), whose gradient is −ĝ.

    Writes into --out: metrics.jsonl (one line per step: reward, pass rate, grad norm before
    clipping, variance proxies, entropy, lengths, tokens sampled, wall time),
    rollouts/step-<s>.jsonl (sampled by the weights of step s−1, ready for `otb-diag energy`),
    checkpoint-<s>/ (every --save-every steps and the last) and train.json.

    --ckpt is the one lab checkpoint training starts from.

    Example: otb-diag train --baseline otb --group-size 4 --updates 20 --out run/
    """
    from otb_diag.pipelines.rl_training import run_train

    result = run_train(
        run.ckpt,
        run.out,
        settings,
        scenario=run.scenario,
        max_new_tokens=run.max_new_tokens,
        progress=not run.quiet,
        say=note,
    )
    show(result, run.as_json)
