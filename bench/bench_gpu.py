"""GPU cost of `otb-diag energy` on a model shaped like Qwen2.5-1.5B (random init, seeded, bf16,
V = 151,936), one response of T = 8,192 tokens after a 64-token prompt:

- time: the statistics pass `checkpoint_stats` (what `otb-diag energy` runs) ÷ a bare log-prob
  forward (`model(...).logits` → fp32 `log_softmax` → gather of the sampled tokens); target ≤ 1.15;
- memory: peak GPU memory above the model and inputs, statistics pass ÷ that bare (naive
  `[B, T, V]` logits) path; target ≤ 0.25;
- full mode: seconds per response of `variance-compare --mode full`'s scores with the
  forward-mode engine (`token_scores(..., engine="forward")`), when this build has it.

Both timed paths run under `torch.no_grad()`, one warm-up each, then the median of `--reps`.
Without CUDA it prints `skipped: no CUDA` and exits 0.

    python bench/bench_gpu.py [--tokens 8192] [--reps 3] [--full-tokens 512]
"""

from __future__ import annotations

import argparse
import inspect
import json
import statistics
import time
from collections.abc import Callable

import torch

VOCAB = 151_936
PROMPT = 64


def qwen15b_shaped():  # -> transformers.Qwen2ForCausalLM, random weights in bf16 on CUDA
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(
        vocab_size=VOCAB,
        hidden_size=1536,
        intermediate_size=8960,
        num_hidden_layers=28,
        num_attention_heads=12,
        num_key_value_heads=2,
        max_position_embeddings=32_768,
        rope_theta=1_000_000.0,
        tie_word_embeddings=True,
    )
    torch.manual_seed(0)
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        with torch.device("cuda"):
            model = Qwen2ForCausalLM(config)
    finally:
        torch.set_default_dtype(default)
    return model.eval()


def one_response_batch(tokens: int):  # -> ResponseBatch of one row
    from otb_diag.io.rollouts.readers import Response, Rollouts
    from otb_diag.io.rollouts.to_batch import make_batch

    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, VOCAB, (PROMPT + tokens,), generator=g).tolist()
    response = Response(
        group="g0", sample=0, source_row=1, prompt_ids=ids[:PROMPT], response_ids=ids[PROMPT:]
    )
    return make_batch(Rollouts(None, "synthetic", [response]))  # type: ignore[arg-type]


def timed(fn: Callable[[], object], reps: int) -> float:
    """Median wall seconds of `fn` after one warm-up, CUDA synchronised."""
    fn()
    times = []
    for _ in range(reps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def peak_above_baseline(fn: Callable[[], object]) -> int:
    """Bytes of GPU memory `fn` allocates at its peak beyond what is allocated before it."""
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    fn()
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() - before


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tokens", type=int, default=8192)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--full-tokens", type=int, default=512)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("skipped: no CUDA")
        return

    from otb_diag.policy.forward_pass import checkpoint_stats
    from otb_diag.policy.scores.token_scores import token_scores

    model = qwen15b_shaped()
    batch = one_response_batch(args.tokens)
    ids = torch.tensor([batch.prompt_ids[0] + batch.response_ids[0].tolist()], device="cuda")

    @torch.no_grad()
    def bare() -> torch.Tensor:
        logits = model(ids).logits[:, PROMPT - 1 : -1].float()
        return logits.log_softmax(-1).gather(-1, ids[:, PROMPT:, None])

    @torch.no_grad()
    def stats() -> object:
        return checkpoint_stats(model, batch, batch_tokens=PROMPT + args.tokens)

    result: dict[str, object] = {
        "device": torch.cuda.get_device_name(),
        "tokens": args.tokens,
        "bare_s": timed(bare, args.reps),
        "stats_s": timed(stats, args.reps),
        "bare_peak_gib": peak_above_baseline(bare) / 2**30,
        "stats_peak_gib": peak_above_baseline(stats) / 2**30,
    }
    result["energy_tokens_per_s"] = args.tokens / result["stats_s"]  # type: ignore[operator]
    result["time_ratio"] = result["stats_s"] / result["bare_s"]  # type: ignore[operator]
    result["memory_ratio"] = result["stats_peak_gib"] / result["bare_peak_gib"]  # type: ignore[operator]
    if "engine" in inspect.signature(token_scores).parameters:
        short = one_response_batch(args.full_tokens)
        seconds = timed(
            lambda: token_scores(model, short, "full", 256, 0, engine="forward", force=True), 1
        )
        result["full_mode_s_per_response"] = seconds
        result["full_mode_tokens"] = args.full_tokens
    else:
        result["full_mode_s_per_response"] = None  # no forward-mode engine in this build
    print(
        f"{result['device']}: statistics pass {result['stats_s']:.3f} s vs bare log-prob forward "
        f"{result['bare_s']:.3f} s (ratio {result['time_ratio']:.2f}, target ≤ 1.15); "
        f"peak {result['stats_peak_gib']:.2f} GiB vs {result['bare_peak_gib']:.2f} GiB "
        f"(ratio {result['memory_ratio']:.2f}, target ≤ 0.25); full mode s/response: "
        f"{result['full_mode_s_per_response']}"
    )
    print(json.dumps(result))


if __name__ == "__main__":
    main()
