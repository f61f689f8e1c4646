"""A real pretrained chat model end to end: SmolLM2-135M-Instruct (49k vocabulary, tied
embeddings, a chat template, EOS handling), loaded from its .gguf file and from a converted
safetensors directory; `rollouts sample` on it, its statistics against an independent forward
pass and autograd, then `energy`, `variance-compare --mode proxy,head` and `report` on the pools."""

import json
from pathlib import Path

import pytest
import torch
from otb_diag.cli.main import app
from typer.testing import CliRunner

from otb_diag.io.checkpoint import Checkpoint, find_checkpoints, load_checkpoint
from otb_diag.policy.forward_pass import stats_for_sequences

pytestmark = pytest.mark.slow
runner = CliRunner()
TAU = 0.8
PROMPTS = [
    {"prompt": "What is 7 + 5? Answer with the number only.", "answer": "12"},
    {
        "prompt": [{"role": "user", "content": "What is 3 times 4? Reply with a number."}],
        "answer": "12",
    },
    {"prompt": "Name the capital of France in one word.", "answer": "Paris"},
]


@pytest.fixture(scope="module")
def pools(smollm2: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("real")
    prompts = root / "prompts.jsonl"
    prompts.write_text("".join(json.dumps(p) + "\n" for p in PROMPTS))
    out = root / "pools"
    result = runner.invoke(
        app,
        [
            "rollouts",
            "sample",
            "--ckpt",
            str(smollm2),
            "--prompts",
            str(prompts),
            "--n",
            "8",
            "--max-new-tokens",
            "24",
            "--temperature",
            str(TAU),
            "--verifier",
            "contains",
            "--dtype",
            "float32",
            "--seed",
            "1",
            "--out",
            str(out),
            "--quiet",
        ],
    )
    assert result.exit_code == 0, result.output
    return out


@pytest.fixture(scope="module")
def loaded(smollm2: Path) -> Checkpoint:
    """The .gguf model loaded once (de-quantized to float32) for the tests that read it."""
    return load_checkpoint(smollm2, dtype="float32")


def rows_of(pools: Path) -> list[dict]:
    return [json.loads(line) for line in (pools / "rollouts.jsonl").read_text().splitlines()]


def test_gguf_and_converted_safetensors_load_to_the_same_model(
    smollm2, smollm2_dir, loaded
) -> None:
    assert find_checkpoints(smollm2) == [smollm2]
    a = loaded
    b = load_checkpoint(smollm2_dir, dtype="float32")
    assert a.vocab_size == b.vocab_size == 49152 and a.model.config.tie_word_embeddings
    ids = torch.tensor([a.tokenizer("The capital of France is")["input_ids"]])
    with torch.no_grad():
        za, zb = a.model(ids).logits, b.model(ids).logits
    assert torch.allclose(za, zb, rtol=1e-5, atol=1e-5 * za.abs().max().item())
    assert a.tokenizer.chat_template and a.tokenizer.chat_template == b.tokenizer.chat_template


def test_sampled_pools_carry_exact_chat_ids_eos_and_truncation(pools, loaded) -> None:
    rows = rows_of(pools)
    tok = loaded.tokenizer
    assert len(rows) == 24 and len({r["group"] for r in rows}) == 3
    text = tok.apply_chat_template(
        [{"role": "user", "content": PROMPTS[0]["prompt"]}],
        add_generation_prompt=True,
        tokenize=False,
    )
    assert rows[0]["prompt_ids"] == tok(text, add_special_tokens=False)["input_ids"]
    for r in rows:
        ended = r["response_ids"][-1] == tok.eos_token_id
        assert r["truncated"] != ended
        assert r["truncated"] == (len(r["response_ids"]) == 24) or ended
        assert r["reward"] == float(PROMPTS[int(r["group"][1:])]["answer"] in r["response"])
    manifest = json.loads((pools / "manifest.json").read_text())
    assert manifest["settings"]["from_policy"] and manifest["responses"] == 24


def test_logged_statistics_match_an_independent_forward_and_autograd(pools, loaded) -> None:
    ckpt = loaded
    for r in rows_of(pools)[::5]:
        ids = torch.tensor([r["prompt_ids"] + r["response_ids"]])
        p, n = len(r["prompt_ids"]), len(r["response_ids"])
        with torch.no_grad():
            z = ckpt.model(ids).logits[0, p - 1 : p + n - 1].float()  # [n, V] predicts y_1..y_n
        logp = torch.log_softmax(z / TAU, -1)
        y = torch.tensor(r["response_ids"])
        ref_lp = logp[torch.arange(n), y]
        ref_pi2 = logp.exp().square().sum(-1)
        assert torch.allclose(torch.tensor(r["logprobs"]), ref_lp, rtol=1e-4, atol=1e-4)
        assert torch.allclose(torch.tensor(r["sum_pi2"]), ref_pi2, rtol=1e-4, atol=1e-6)
        # w_t = ‖∂ log p_t / ∂z_t‖² by autograd, against the forward pass's closed form
        zt = z.clone().requires_grad_(True)
        torch.log_softmax(zt / TAU, -1)[torch.arange(n), y].sum().backward()
        (stats,) = stats_for_sequences(ckpt.model, [r["prompt_ids"]], [r["response_ids"]], TAU)
        autograd_w = zt.grad.square().sum(-1)
        # The statistics pass and this forward batch the model differently, so their float32
        # logits round apart (by `gap` in log p, ~1e-5 here); w moves with the logits by a few
        # times that, relative (measured up to 1.4e-4 at w = 0.04 with gap 1.6e-5).
        gap = (stats.logprob - ref_lp).abs().max().item()
        assert torch.allclose(stats.w, autograd_w, rtol=1e-4 + 20 * gap, atol=1e-7)


def test_energy_variance_compare_and_report_run_on_the_pools(pools, smollm2, tmp_path) -> None:
    energy = runner.invoke(
        app,
        [
            "energy",
            "--ckpt",
            str(smollm2),
            "--rollouts",
            str(pools),
            "--out",
            str(tmp_path / "energy"),
            "--dtype",
            "float32",
            "--quiet",
            "--json",
        ],
    )
    assert energy.exit_code == 0, energy.output
    tokens = __import__("pandas").read_parquet(tmp_path / "energy/tokens.parquet")
    logged = [lp for r in rows_of(pools) for lp in r["logprobs"]]
    assert len(tokens) == len(logged)
    assert (tokens["logprob"] - torch.tensor(logged).numpy()).abs().max() < 1e-4
    variance = runner.invoke(
        app,
        [
            "variance-compare",
            "--ckpt",
            str(smollm2),
            "--rollouts",
            str(pools),
            "--mode",
            "proxy,head",
            "--group-sizes",
            "2,4",
            "--draws",
            "20",
            "--bootstrap",
            "50",
            "--out",
            str(tmp_path / "variance"),
            "--dtype",
            "float32",
            "--quiet",
            "--json",
        ],
    )
    assert variance.exit_code == 0, variance.output
    table = __import__("pandas").read_csv(tmp_path / "variance/variance.csv")
    assert set(table["mode"]) == {"proxy", "head"} and (table["variance"] > 0).all()
    report = runner.invoke(
        app,
        [
            "report",
            str(tmp_path / "energy"),
            str(tmp_path / "variance"),
            "--out",
            str(tmp_path / "report.html"),
        ],
    )
    assert report.exit_code == 0, report.output
    assert "OTB" in (tmp_path / "report.html").read_text()
