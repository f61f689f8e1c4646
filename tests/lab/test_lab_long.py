"""The long scenario: the running-sum task, its tokenizer, left-padded sampling, a reduced build
and the `--scenario` plumbing (the shipped data itself: tests/test_lab_long_shipped.py)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers import AutoModelForCausalLM, AutoTokenizer

from otb_diag.io.scenarios import default_checkpoint
from otb_diag.lab.build import LONG, LabConfig, build_lab
from otb_diag.lab.rollouts import sample_continuations
from otb_diag.lab.sft import digit_ceiling
from otb_diag.lab.task import (
    END,
    LABELS,
    Problem,
    answer,
    make_problem,
    parse_prompt,
    problem_tokens,
    target,
    verify,
)
from otb_diag.lab.tokenizer import LONG_ALPHABET, build_tokenizer

LONG_TOKENIZER = build_tokenizer(LONG_ALPHABET)


# --- task --------------------------------------------------------------------------------------


def test_sum_hand_case() -> None:
    problem = Problem("A", "392")
    assert problem.prompt == "A:a3b9c2="
    # 3, 3+9=12 -> 2, 2+2=4: every line is label, digit, total before, total after (mod 10).
    assert target(problem) == "a3+0=3;b9+3=2;c2+2=4;#4" + END
    assert answer("A", "392") == "4"
    assert parse_prompt(problem.prompt) == problem
    assert verify(problem.prompt, target(problem)) == 1.0
    assert verify(problem.prompt, "#4" + END) == 1.0  # only the final answer is checked
    assert verify(problem.prompt, "a3+0=3;b9+3=1;c2+1=3;#4" + END) == 1.0  # wrong work, right end
    assert verify(problem.prompt, "a3+0=3;b9+3=2;c2+2=4;#5" + END) == 0.0
    assert verify(problem.prompt, "a3+0=3;#1;#4" + END) == 1.0  # the last '#' counts
    assert verify(problem.prompt, "a3+0=3;b9+3=2;c2+2=4;4" + END) == 0.0  # no answer marker
    assert verify(problem.prompt, "a3+0=3;b9+3=2;c2+2=4;#4") == 0.0  # never ended
    assert verify(problem.prompt, "#14" + END) == 0.0


@settings(max_examples=80, deadline=None)
@given(digits=st.text(alphabet="0123456789", min_size=1, max_size=len(LABELS)))
def test_sum_scratchpad_properties(digits: str) -> None:
    problem = Problem("A", digits)
    assert parse_prompt(problem.prompt) == problem
    lines = target(problem).removesuffix(END).split(";")
    work, final = lines[:-1], lines[-1]
    assert len(work) == len(digits)
    total = 0
    for label, digit, line in zip(LABELS, digits, work, strict=False):
        assert line == f"{label}{digit}+{total}={(total + int(digit)) % 10}"
        total = (total + int(digit)) % 10
    assert final == f"#{sum(map(int, digits)) % 10}"
    # 7 tokens per line: the response length grows linearly with the problem.
    ids = LONG_TOKENIZER.encode(target(problem), add_special_tokens=False)
    assert len(ids) == 7 * len(digits) + 3
    assert LONG_TOKENIZER.decode(ids) == target(problem)
    assert problem_tokens("A", len(digits)) == len(problem.prompt) + len(ids)


def test_sum_prompt_errors() -> None:
    with pytest.raises(ValueError, match="labels out of order"):
        parse_prompt("A:a3c9=")
    with pytest.raises(ValueError):
        parse_prompt("A:a3b=")
    with pytest.raises(ValueError, match="at most 52"):
        make_problem(np.random.default_rng(0), "A", len(LABELS) + 1)


def test_long_alphabet_has_no_repeats() -> None:
    with pytest.raises(ValueError, match="repeated"):
        build_tokenizer("0123456789A" + LABELS)
    assert len(LONG_TOKENIZER) == 4 + len(LONG_ALPHABET)
    assert LONG_TOKENIZER.convert_tokens_to_ids("A") != LONG_TOKENIZER.unk_token_id


def test_long_config_fits_the_model() -> None:
    """The longest prompt plus the response budget fits the positions, and the budget holds the
    longest correct response."""
    longest = max(n for _, n in LONG.rollout_prompts)
    problem = Problem("A", "9" * longest)
    prompt = len(LONG_TOKENIZER.encode(problem.prompt, add_special_tokens=False))
    response = len(LONG_TOKENIZER.encode(target(problem), add_special_tokens=False))
    assert response <= LONG.max_new_tokens
    assert prompt + LONG.max_new_tokens <= LONG.n_positions
    assert len(LONG.rollout_prompts) >= 16 and LONG.group_size >= 128


# --- sampling with left padding ----------------------------------------------------------------


def test_left_padded_batch_samples_what_each_row_samples_alone() -> None:
    """Rows of unequal prompt length in one batch see the positions they see alone: with the
    same random stream per row (batch of one, then the row inside a padded batch, at a near-zero
    temperature so sampling is the argmax) the continuations are equal."""
    path = default_checkpoint()
    model = AutoModelForCausalLM.from_pretrained(path).eval()
    tok = AutoTokenizer.from_pretrained(path)
    prompts = ["S:3920=", "C:123456789=", "R:55123="]
    contexts = [tok.encode(p, add_special_tokens=False) for p in prompts]
    kwargs = dict(
        temperature=1e-4, max_new_tokens=16, stop_ids=[tok.eos_token_id], pad_id=tok.pad_token_id
    )
    together = sample_continuations(model, contexts, **kwargs)
    alone = [sample_continuations(model, [c], **kwargs)[0] for c in contexts]
    assert together == alone
    assert all(row and row[-1] == tok.eos_token_id for row in together)


# --- curriculum --------------------------------------------------------------------------------


def test_digit_ceiling_hand_cases() -> None:
    # (8, 0.5) over 100 steps of 3..52 digits: 8 at step 0, 8 + 44 * 25/50 = 30 at step 25,
    # the full 52 from step 50 on; no curriculum: 52 throughout.
    ceilings = [digit_ceiling(s, 100, (3, 52), (8, 0.5)) for s in (0, 25, 49, 50, 99)]
    assert ceilings == [8, 30, 51, 52, 52]
    assert {digit_ceiling(s, 100, (3, 52), None) for s in range(100)} == {52}
    assert digit_ceiling(0, 100, (3, 52), (1, 0.5)) == 3  # never below the smallest count


@given(
    steps=st.integers(1, 500),
    low=st.integers(1, 10),
    span=st.integers(0, 50),
    start=st.integers(1, 60),
    fraction=st.floats(0.01, 1.0),
)
def test_digit_ceiling_grows_within_bounds(
    steps: int, low: int, span: int, start: int, fraction: float
) -> None:
    digits = (low, low + span)
    ceilings = [digit_ceiling(s, steps, digits, (start, fraction)) for s in range(steps)]
    assert all(low <= c <= low + span for c in ceilings)
    assert ceilings == sorted(ceilings)  # never shrinks
    if steps >= 2:
        assert ceilings[-1] == low + span or fraction * steps > steps - 1


# --- reduced build (CI) ------------------------------------------------------------------------

TINY_LONG = LabConfig(
    ops=("A",),
    train_digits=(3, 8),
    curriculum=(4, 0.5),
    alphabet=LONG_ALPHABET,
    n_embd=32,
    n_layer=1,
    n_head=2,
    n_positions=96,
    steps=4,
    save_steps=(2, 4),
    batch_tokens=128,
    eval_digits=(3,),
    eval_per_cell=2,
    rollout_prompts=(("A", 3), ("A", 8)),
    group_size=4,
    tir_digits=(),
    max_new_tokens=64,
)


@pytest.mark.slow  # builds a lab
def test_reduced_long_build(tmp_path: Path) -> None:
    summary = build_lab(tmp_path, seed=1, config=TINY_LONG, progress=False)
    assert not (tmp_path / "rollouts_tir.jsonl").exists()
    assert "rollouts_tir" not in summary
    assert set(summary["checkpoints"][-1]["pass_rate"]) == {"A"}
    rows = [json.loads(line) for line in (tmp_path / "rollouts.jsonl").read_text().splitlines()]
    assert [r["group"] for r in rows] == ["g00"] * 4 + ["g01"] * 4
    tok = AutoTokenizer.from_pretrained(tmp_path / "checkpoints" / "checkpoint-4")
    assert len(tok) == len(LONG_TOKENIZER)
    for r in rows:
        assert r["op"] == "A" and parse_prompt(r["prompt"]).op == "A"
        assert tok.encode(r["prompt"], add_special_tokens=False) == r["prompt_ids"]
        assert tok.decode(r["response_ids"]) == r["response"]
        assert r["reward"] == verify(r["prompt"], r["response"])
        assert len(r["response_ids"]) <= TINY_LONG.max_new_tokens
    assert summary["rollouts"]["groups"] == 2
    with torch.no_grad():  # the saved model reads the long alphabet
        model = AutoModelForCausalLM.from_pretrained(tmp_path / "checkpoints" / "checkpoint-4")
        assert model.config.vocab_size == len(LONG_TOKENIZER)
