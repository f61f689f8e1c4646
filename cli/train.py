"""`otb-diag train`: online policy-gradient RL on the toy lab task, on CPU."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from otb_diag.cli.common import note, show
from otb_diag.cli.options import OUT_DIR, Measuring, command

from otb_diag.knobs import knob
from otb_diag.pipelines.train_settings import TrainSettings


@dataclass(frozen=True)
class TrainRun(Measuring):
    out: Path = knob(Path("otb-train"), OUT_DIR)


@command(skip=("inputs.rollouts",))  # it samples its own
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

    result = run_train(run.inputs, run.out, settings, progress=not run.quiet, say=note)
    show(result, run.as_json)
