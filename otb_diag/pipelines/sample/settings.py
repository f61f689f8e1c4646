"""Every knob of `otb-diag rollouts sample`, declared once (the command line is built from them;
no torch at import)."""

from __future__ import annotations

import operator
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from otb_diag.errors import InputError
from otb_diag.io.load_options import LoadOptions
from otb_diag.knobs import knob
from otb_diag.pipelines.measure_knobs import BATCH_TOKENS
from otb_diag.pipelines.sample.verifiers import verifier_usage
from otb_diag.policy.sampling_options import Sampling

if TYPE_CHECKING:
    from otb_diag.pipelines.sample.verifiers import Verifier


@dataclass(frozen=True)
class SampleSettings:
    """Everything that decides the pools (and so must match on `--resume`), plus how to load."""

    n: int = knob(64, help="Responses per prompt (the pool size M).")
    sampling: Sampling = field(default_factory=Sampling)
    seed: int = knob(0, help="Seed; each response draws from (seed, prompt, index).")
    verifier: str = knob("last-number", help=lambda: f"Reward: {verifier_usage()}.")
    prompt_column: str = knob("prompt", help="Column holding the prompt.")
    answer_column: str | None = knob(
        None, help="Column holding the answer. Default: 'answer' when present."
    )
    chat_template: bool = knob(
        True,
        flag="--no-chat-template",
        parse=operator.not_,
        show=operator.not_,
        help="Tokenize text prompts as they are, even when the tokenizer has a chat template.",
    )
    batch_tokens: int = knob(32768, BATCH_TOKENS)
    load: LoadOptions = field(default_factory=LoadOptions)
    # How this run treats --out, not what the pools are: left out of `identity`.
    resume: bool = knob(False, help="Finish a killed run into the same --out.")

    def check(self) -> Verifier:
        """Raise `InputError` for a bad setting before anything is read; returns the verifier."""
        s = self.sampling
        problems = [
            (self.n < 1, "n", f"--n must be at least 1, got {self.n}"),
            (
                not s.temperature > 0,
                "temperature",
                f"--temperature must be > 0, got {s.temperature}",
            ),
            (not 0 < s.top_p <= 1, "top-p", f"--top-p must lie in (0, 1], got {s.top_p}"),
            (s.top_k < 0, "top-k", f"--top-k must be ≥ 0 (0 = off), got {s.top_k}"),
            (s.max_new_tokens < 1, "max-new-tokens", "--max-new-tokens must be at least 1"),
            (self.batch_tokens < 1, "batch-tokens", "--batch-tokens must be at least 1"),
        ]
        for bad, name, message in problems:
            if bad:
                raise InputError(message, field=name)
        from otb_diag.pipelines.sample.verifiers import get_verifier, require_math_verify

        self.load.check()
        verifier = get_verifier(self.verifier)
        require_math_verify(self.verifier)
        return verifier

    def identity(self) -> dict[str, Any]:
        """What a resumed run must share with the run it continues."""
        record = asdict(self)
        record.pop("load")
        record.pop("resume")
        record.update(record.pop("sampling"))  # temperature, top_k, top_p, max_new_tokens
        record["dtype"] = self.load.dtype
        return record
