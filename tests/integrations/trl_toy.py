"""A real TRL `GRPOTrainer` on CPU from the embedded checkpoint, as
tests/io/trainers/test_trl_integration.py sets one up; shared by the live tests and
bench/bench_live.py.

Every prompt is six tokens long, so TRL pads no prompt: its training forward gives a left-padded
prompt no position ids, and the toy model (GPT-2, absolute positions) then scores the padded
prompts' completions at shifted positions, which `otb-diag energy` (unpadded) does not
reproduce (docs/live.md, "TRL and left padding")."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from otb_diag.io.scenarios import default_checkpoint
from otb_diag.lab.task import answer, parse_prompt

PROMPTS = ["C:684=", "R:372=", "S:951=", "C:120=", "R:581=", "S:310=", "C:709=", "R:413="]
GENERATIONS = 4


def correct(prompts: list[str], completions: list[str], **_: object) -> list[float]:
    """1 when the completion starts with the answer: TRL decodes with skip_special_tokens, so
    the end marker the toy model emits is not in the text a reward function sees."""
    out = []
    for p, c in zip(prompts, completions, strict=True):
        problem = parse_prompt(p)
        out.append(float(c.startswith(answer(problem.op, problem.digits))))
    return out


def short(prompts: list[str], completions: list[str], **_: object) -> list[float]:
    return [0.1 if len(c) <= 3 else 0.0 for c in completions]


def toy_trainer(
    out: Path,
    steps: int,
    *,
    per_step: int = 8,
    ckpt: Path | None = None,
    rloo: bool = False,
    prompts: list[str] | None = None,
    peft_config: Any = None,
    **config: Any,
) -> Any:
    """A constructed GRPOTrainer (an RLOOTrainer with `rloo`) writing to `out` (`per_step`
    completions a process and micro-step, groups of `GENERATIONS`, seed 0) on `ckpt` (default:
    the embedded checkpoint; another must use its tokenizer, as bench/bench_live.py's larger
    random-weight bodies do) and `prompts` (default `PROMPTS`, six tokens each), a PEFT adapter
    trained on it when `peft_config` is given (`peft.LoraConfig(...)`); `config` overrides
    GRPOConfig (RLOOConfig) fields."""
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer, RLOOConfig, RLOOTrainer

    settings = {
        "output_dir": str(out),
        "per_device_train_batch_size": per_step,
        "num_generations": GENERATIONS,
        "max_completion_length": 12,
        "max_steps": steps,
        "logging_steps": 1,
        "save_strategy": "no",
        "report_to": [],
        "use_cpu": True,
        "learning_rate": 1e-3,
        "seed": 0,
        "bf16": False,  # fp32, the reference; test_trl_precision.py runs bf16 and fp16
        "disable_tqdm": True,
        **config,
    }
    ckpt = ckpt or default_checkpoint()
    tokenizer = AutoTokenizer.from_pretrained(ckpt)
    trainer, config_class = (RLOOTrainer, RLOOConfig) if rloo else (GRPOTrainer, GRPOConfig)
    return trainer(
        model=AutoModelForCausalLM.from_pretrained(ckpt),
        reward_funcs=[correct, short],
        args=config_class(**settings),
        train_dataset=Dataset.from_dict({"prompt": prompts or PROMPTS}),
        processing_class=tokenizer,
        peft_config=peft_config,
    )
