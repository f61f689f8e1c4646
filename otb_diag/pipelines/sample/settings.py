"""Every knob of `otb-diag rollouts sample`, declared once (the command line is built from them;
no torch at import)."""

from __future__ import annotations

import operator
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from otb_diag.io.load_options import LoadOptions
from otb_diag.knobs import Checked, at_least, knob, named, valid_seed
from otb_diag.pipelines.measure_knobs import BATCH_TOKENS
from otb_diag.pipelines.sample.verifiers import verifier_usage
from otb_diag.policy.sampling_options import Sampling

if TYPE_CHECKING:
    from otb_diag.pipelines.sample.verifiers import Verifier


@dataclass(frozen=True)
class SampleSettings(Checked):
    """Everything that decides the pools (and so must match on `--resume`), plus how to load."""

    n: int = knob(
        64,
        at_least(1),
        help="Responses per prompt (the pool size M; 1 is groups of one, where a group "
        "baseline has nothing to compare: said as a warning).",
    )
    sampling: Sampling = field(default_factory=Sampling)
    seed: int = knob(0, valid_seed, help="Seed; each response draws from (seed, prompt, index).")
    verifier: str = knob("last-number", help=lambda: f"Reward: {verifier_usage()}.")
    prompt_column: str = knob("prompt", named, help="Column holding the prompt.")
    answer_column: str | None = knob(
        None, named, help="Column holding the answer. Default: 'answer' when present."
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
        """Raise `InputError` for a verifier that cannot run or a device this machine lacks,
        before anything is read (each knob's own value was checked when the settings were
        built); returns the verifier."""
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
