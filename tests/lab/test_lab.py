"""The embedded toy lab: task verifier, tokenizer, deterministic build, the shipped default."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoTokenizer

from otb_diag.io.scenarios import (
    DEFAULT_ROLLOUTS,
    DEFAULT_TIR_ROLLOUTS,
    default_checkpoint,
    default_checkpoints,
)
from otb_diag.lab.build import LabConfig, build_lab
from otb_diag.lab.task import CALL, END, Problem, answer, target, tool_output, verify
from otb_diag.lab.tokenizer import build_tokenizer
from otb_diag.pipelines import lab_build
from otb_diag.pipelines.inputs import LabInputs
from otb_diag.pipelines.lab_settings import LabSettings

TOKENIZER = build_tokenizer()


def _rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


# --- task --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("op", "correct"), [("C", "83920"), ("R", "02938"), ("S", "02389"), ("T", "02389")]
)
def test_verify_hand_cases(op: str, correct: str) -> None:
    prompt = f"{op}:83920="
    assert answer(op, "83920") == correct
    assert verify(prompt, correct + END) == 1.0
    assert verify(prompt, correct + END + "junk after the end") == 1.0  # only the answer counts
    wrong_digit = ("1" if correct[0] != "1" else "2") + correct[1:]
    assert verify(prompt, wrong_digit + END) == 0.0
    assert verify(prompt, correct) == 0.0  # no end marker: never committed
    assert verify(prompt, correct + "7" + END) == 0.0  # extra text before the marker
    assert verify(prompt, correct[:-1] + END) == 0.0  # one digit short
    assert verify(prompt, "x" + correct + END) == 0.0


def test_verify_tool_segments() -> None:
    problem = Problem("T", "83920")
    assert target(problem) == CALL + "[02389]" + "02389" + END
    assert verify(problem.prompt, target(problem)) == 1.0
    assert verify(problem.prompt, CALL + "[02389]" + "02398" + END) == 0.0
    # The tool's reply is not an answer by itself.
    assert verify(problem.prompt, CALL + tool_output("83920") + END) == 0.0


def test_verify_rejects_non_lab_prompt() -> None:
    with pytest.raises(ValueError):
        verify("X:123=", "123" + END)


# --- tokenizer ---------------------------------------------------------------------------------

digit_strings = st.text(alphabet="0123456789", min_size=3, max_size=40)


@settings(max_examples=60, deadline=None)
@given(op=st.sampled_from("CRST"), digits=digit_strings, cut=st.integers(0, 200))
def test_tokenizer_round_trip_and_split(op: str, digits: str, cut: int) -> None:
    problem = Problem(op, digits)
    for text in (problem.prompt, target(problem), problem.prompt + target(problem)):
        ids = TOKENIZER.encode(text, add_special_tokens=False)
        assert TOKENIZER.decode(ids) == text
    # Tokenizing prompt and response apart gives the same ids as tokenizing them together.
    prompt, response = problem.prompt, target(problem)[: cut % (len(target(problem)) + 1)]
    whole = TOKENIZER.encode(prompt + response, add_special_tokens=False)
    parts = TOKENIZER.encode(prompt, add_special_tokens=False) + TOKENIZER.encode(
        response, add_special_tokens=False
    )
    assert whole == parts


def test_tokenizer_markers_are_single_tokens() -> None:
    assert TOKENIZER.encode(END, add_special_tokens=False) == [TOKENIZER.eos_token_id]
    assert len(TOKENIZER.encode(CALL, add_special_tokens=False)) == 1
    assert TOKENIZER.pad_token_id is not None
    assert TOKENIZER.pad_token_id != TOKENIZER.eos_token_id


def test_tokenizer_save_and_reload(tmp_path: Path) -> None:
    TOKENIZER.save_pretrained(str(tmp_path))
    loaded = AutoTokenizer.from_pretrained(str(tmp_path))
    text = "T:83920=" + CALL + "[02389]02389" + END
    ids = TOKENIZER.encode(text, add_special_tokens=False)
    assert loaded.encode(text, add_special_tokens=False) == ids
    assert loaded.decode(ids) == text
    assert loaded.eos_token_id == TOKENIZER.eos_token_id
    assert loaded.pad_token_id == TOKENIZER.pad_token_id


# --- build -------------------------------------------------------------------------------------

TINY = LabConfig(
    n_embd=32,
    n_layer=1,
    n_head=2,
    steps=6,
    save_steps=(2, 4, 6),
    batch_tokens=64,
    eval_digits=(3,),
    eval_per_cell=2,
    rollout_prompts=(("C", 3), ("S", 5)),
    group_size=4,
    tir_digits=(4,),
    tir_group_size=4,
    max_new_tokens=12,
    tir_max_new_tokens=24,
)


@pytest.fixture(scope="module")
def tiny_builds(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, dict]:
    """`a` built by `build_lab` itself; `b` by `lab build`'s entry point (TINY standing in for
    the default scenario), staged and moved into a folder that holds a stale checkpoint."""
    a, b = tmp_path_factory.mktemp("lab_a"), tmp_path_factory.mktemp("lab_b")
    summary = build_lab(a, seed=3, config=TINY, progress=False)
    (b / "checkpoints/checkpoint-999").mkdir(parents=True)
    with pytest.MonkeyPatch.context() as patch:
        patch.setitem(lab_build.SCENARIOS, "default", TINY)
        built = lab_build.run_lab_build(LabInputs(), b, LabSettings(seed=3), progress=False)
    assert (
        built is not None
        and built.out == b
        and built.to_json() == summary | {"timings": built.to_json()["timings"]}
    )
    return a, b, summary


@pytest.mark.slow  # builds two labs
def test_build_is_deterministic(tiny_builds: tuple[Path, Path, dict]) -> None:
    a, b, summary = tiny_builds
    for name in ("rollouts.jsonl", "rollouts_tir.jsonl"):
        assert (a / name).read_bytes() == (b / name).read_bytes()
    steps = [c["step"] for c in summary["checkpoints"]]
    assert steps == [2, 4, 6]
    for step in steps:
        wa = load_file(a / "checkpoints" / f"checkpoint-{step}" / "model.safetensors")
        wb = load_file(b / "checkpoints" / f"checkpoint-{step}" / "model.safetensors")
        assert wa.keys() == wb.keys()
        assert all(torch.equal(wa[k], wb[k]) for k in wa)
    # The staged build replaced the folder's stale checkpoints whole.
    assert sorted(p.name for p in (b / "checkpoints").iterdir()) == [
        f"checkpoint-{s}" for s in steps
    ]
    assert not list(b.glob(".otb-diag-staging-*"))
    # Training moved the weights: the checkpoints are not all the same.
    w2 = load_file(a / "checkpoints" / "checkpoint-2" / "model.safetensors")
    w6 = load_file(a / "checkpoints" / "checkpoint-6" / "model.safetensors")
    assert any(not torch.equal(w2[k], w6[k]) for k in w2)


@pytest.mark.slow  # builds two labs
def test_build_layout_and_rows(tiny_builds: tuple[Path, Path, dict]) -> None:
    a, _, summary = tiny_builds
    lab = json.loads((a / "lab.json").read_text())
    assert lab["seed"] == 3
    assert lab["config"]["group_size"] == 4
    for step in (2, 4, 6):
        ckpt = a / "checkpoints" / f"checkpoint-{step}"
        for name in ("config.json", "model.safetensors", "generation_config.json"):
            assert (ckpt / name).is_file(), name
        assert AutoTokenizer.from_pretrained(str(ckpt)).eos_token_id == TOKENIZER.eos_token_id
    rows = _rows(a / "rollouts.jsonl")
    assert [r["group"] for r in rows] == ["g00"] * 4 + ["g01"] * 4
    assert {r["step"] for r in rows} == {6}
    assert {r["temperature"] for r in rows} == {TINY.temperature}
    tir = _rows(a / "rollouts_tir.jsonl")
    assert len(tir) == 4
    assert all(len(r["mask"]) == len(r["response_ids"]) for r in tir)


# --- the shipped default -----------------------------------------------------------------------


def test_default_loads_through_auto_classes() -> None:
    ckpts = default_checkpoints()
    assert len(ckpts) >= 4
    path = default_checkpoint()
    model = AutoModelForCausalLM.from_pretrained(path).eval()
    tok = AutoTokenizer.from_pretrained(path)
    assert not model.config.tie_word_embeddings
    assert model.lm_head.weight.data_ptr() != model.transformer.wte.weight.data_ptr()
    rows = _rows(DEFAULT_ROLLOUTS)
    row = max(rows, key=lambda r: len(r["response_ids"]))
    ids = torch.tensor([row["prompt_ids"] + row["response_ids"]])
    assert ids.shape[1] <= model.config.n_positions
    with torch.no_grad():
        logits = model(input_ids=ids).logits
    assert logits.shape == (1, ids.shape[1], len(tok))


def test_default_rollouts_consistent() -> None:
    tok = AutoTokenizer.from_pretrained(default_checkpoint())
    final_step = int(default_checkpoint().name.split("-")[-1])
    rows = _rows(DEFAULT_ROLLOUTS)
    assert len(rows) >= 16 * 32
    groups: dict[str, list[float]] = {}
    for r in rows:
        assert tok.decode(r["response_ids"]) == r["response"]
        assert tok.encode(r["response"], add_special_tokens=False) == r["response_ids"]
        assert tok.encode(r["prompt"], add_special_tokens=False) == r["prompt_ids"]
        assert r["reward"] == verify(r["prompt"], r["response"])
        assert r["step"] == final_step
        groups.setdefault(r["group"], []).append(r["reward"])
    lengths = [len(r["response_ids"]) for r in rows]
    assert max(lengths) >= 8 * min(lengths)
    mixed = sum(0 < sum(g) < len(g) for g in groups.values())
    assert mixed > len(groups) / 2


def test_default_tir_mask_marks_tool_output() -> None:
    tok = AutoTokenizer.from_pretrained(default_checkpoint())
    call_id = tok.convert_tokens_to_ids(CALL)
    rows = _rows(DEFAULT_TIR_ROLLOUTS)
    assert rows
    n_calls = 0
    for r in rows:
        ids, mask = r["response_ids"], r["mask"]
        assert len(mask) == len(ids)
        assert tok.decode(ids) == r["response"]
        assert r["reward"] == verify(r["prompt"], r["response"])
        # Rebuild the expected mask: after each <call> the tool's reply has mask 0.
        reply = tok.encode(tool_output(r["prompt"][2:-1]), add_special_tokens=False)
        expected, i = [], 0
        while i < len(ids):
            expected.append(1)
            if ids[i] == call_id and ids[i + 1 : i + 1 + len(reply)] == reply:
                expected += [0] * len(reply)
                i += len(reply)
                n_calls += 1
            i += 1
        assert mask == expected
    assert n_calls > 0
