"""A real pretrained chat model end to end: SmolLM2-135M-Instruct (49k vocabulary, tied
embeddings, a chat template, EOS handling), loaded from its .gguf file and from a safetensors
directory converted from it; `rollouts sample`, its statistics against an independent forward pass
and autograd, then `energy`, `variance-compare` (proxy, head) and `report` on the pools. Loading
the .gguf is most of the time (its tokenizer is rebuilt from the file's vocabulary): it is loaded
once, by the `loaded` fixture; the commands load the converted directory, the same float32
weights and chat template (the first test) and the same tokenizer (the sampled prompt ids are
checked against the .gguf's own tokenizer). Pools are the smallest that show each assertion:
3 prompts x 4 responses of at most 16 tokens."""

import json
from pathlib import Path

import pandas as pd
import pytest
import torch
from small_runs import energy, report

from otb_diag.io.checkpoint import Checkpoint, find_checkpoints, load_checkpoint
from otb_diag.io.load_options import LoadOptions
from otb_diag.pipelines.inputs import Inputs, SampleInputs
from otb_diag.pipelines.sample.recipe import run_sample
from otb_diag.pipelines.sample.settings import SampleSettings
from otb_diag.pipelines.variance.recipe import run_variance
from otb_diag.pipelines.variance.settings import VarianceSettings
from otb_diag.policy.forward_pass import stats_for_sequences
from otb_diag.policy.sampling_options import Sampling

pytestmark = pytest.mark.slow
TAU = 0.8
N, MAX_NEW = 4, 16  # responses per prompt (group size 2 ≤ M/2 for variance-compare), tokens
FLOAT32 = LoadOptions(dtype="float32")
PROMPTS = [
    {"prompt": "What is 7 + 5? Answer with the number only.", "answer": "12"},
    {
        "prompt": [{"role": "user", "content": "What is 3 times 4? Reply with a number."}],
        "answer": "12",
    },
    {"prompt": "Name the capital of France in one word.", "answer": "Paris"},
]


@pytest.fixture(scope="module")
def loaded(smollm2: Path) -> Checkpoint:
    """The .gguf model loaded once (de-quantized to float32) for the tests that read it."""
    return load_checkpoint(smollm2, dtype="float32")


@pytest.fixture(scope="module")
def converted(loaded: Checkpoint, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`loaded` saved as a Hugging Face directory: safetensors weights, tokenizer."""
    out = tmp_path_factory.mktemp("smollm2-hf")
    # transformers marks a model read from GGUF as quantized and refuses to save it; the loader
    # drops that mark (`io/checkpoint.py:_forget_gguf_quantizer`), so it saves as it is (what
    # `train --ckpt model.gguf` does at each checkpoint).
    assert getattr(loaded.model, "hf_quantizer", None) is None
    loaded.model.save_pretrained(out, safe_serialization=True)
    loaded.tokenizer.save_pretrained(out)
    return out


@pytest.fixture(scope="module")
def pools(converted: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("real")
    prompts = root / "prompts.jsonl"
    prompts.write_text("".join(json.dumps(p) + "\n" for p in PROMPTS))
    out = root / "pools"
    settings = SampleSettings(
        n=N,
        sampling=Sampling(temperature=TAU, max_new_tokens=MAX_NEW),
        seed=1,
        verifier="contains",
        load=FLOAT32,
    )
    assert run_sample(SampleInputs(prompts, converted), out, settings, progress=False) is not None
    return out


def rows_of(pools: Path) -> list[dict]:
    return [json.loads(line) for line in (pools / "rollouts.jsonl").read_text().splitlines()]


def test_gguf_and_converted_safetensors_load_to_the_same_model(smollm2, converted, loaded) -> None:
    assert find_checkpoints(smollm2) == [smollm2]
    a = loaded
    b = load_checkpoint(converted, dtype="float32")
    assert a.vocab_size == b.vocab_size == 49152 and a.model.config.tie_word_embeddings
    ids = torch.tensor([a.tokenizer("The capital of France is")["input_ids"]])
    with torch.no_grad():
        za, zb = a.model(ids).logits, b.model(ids).logits
    assert torch.allclose(za, zb, rtol=1e-5, atol=1e-5 * za.abs().max().item())
    assert a.tokenizer.chat_template and a.tokenizer.chat_template == b.tokenizer.chat_template


def test_sampled_pools_carry_exact_chat_ids_eos_and_truncation(pools, loaded) -> None:
    rows = rows_of(pools)
    tok = loaded.tokenizer
    assert len(rows) == N * len(PROMPTS) and len({r["group"] for r in rows}) == len(PROMPTS)
    text = tok.apply_chat_template(
        [{"role": "user", "content": PROMPTS[0]["prompt"]}],
        add_generation_prompt=True,
        tokenize=False,
    )
    assert rows[0]["prompt_ids"] == tok(text, add_special_tokens=False)["input_ids"]
    for r in rows:
        ended = r["response_ids"][-1] == tok.eos_token_id
        assert r["truncated"] != ended
        assert r["truncated"] == (len(r["response_ids"]) == MAX_NEW) or ended
        assert r["reward"] == float(PROMPTS[int(r["group"][1:])]["answer"] in r["response"])
    manifest = json.loads((pools / "manifest.json").read_text())
    assert manifest["settings"]["from_policy"] and manifest["responses"] == N * len(PROMPTS)


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


def test_energy_variance_compare_and_report_run_on_the_pools(pools, converted, tmp_path) -> None:
    energy(pools, tmp_path / "energy", ckpt=converted, load=FLOAT32)
    settings = VarianceSettings(
        modes=("proxy", "head"), group_sizes=(2,), draws=20, bootstrap=50, load=FLOAT32
    )
    given = Inputs(ckpt=[converted], rollouts=pools)
    run_variance(given, tmp_path / "variance", settings, progress=False)
    tokens = pd.read_parquet(tmp_path / "energy/tokens.parquet")
    logged = [lp for r in rows_of(pools) for lp in r["logprobs"]]
    assert len(tokens) == len(logged)
    assert (tokens["logprob"] - torch.tensor(logged).numpy()).abs().max() < 1e-4
    table = pd.read_csv(tmp_path / "variance/variance.csv")
    assert set(table["mode"]) == {"proxy", "head"} and (table["variance"] > 0).all()
    report([tmp_path / "energy", tmp_path / "variance"], tmp_path / "report.html")
    assert "OTB" in (tmp_path / "report.html").read_text()
