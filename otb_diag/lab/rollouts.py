"""Rollouts from a lab checkpoint: groups of N verifier-scored responses per prompt, as rollout
rows; plain, or tool-use (TIR) over several turns.

Every response is drawn by the one sampler, `otb_diag/policy/sampling.py:sample_batch`, from
``softmax(z / temperature)`` (``top_k=0``, ``top_p=1.0``), the policy the diagnostics assume,
with torch's global RNG as its noise (`otb_diag/policy/noise.py:GlobalRng`, the draw of
Hugging Face's `generate(do_sample=True)`, with which the embedded labs were sampled): seed it
(`torch.manual_seed`) before a call and the rows are a function of the seed.

The tool-use (TIR) variant stops generation at ``<call>``, splices the tool's output into the
response with mask 0 and lets the model continue, as multi-turn RL frameworks do.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from transformers import GPT2LMHeadModel, PreTrainedTokenizerFast

from otb_diag.lab.task import CALL, parse_prompt, tool_output, verify
from otb_diag.policy.noise import GlobalRng
from otb_diag.policy.sampling import Sampling, sample_batch


def sample_continuations(
    model: GPT2LMHeadModel,
    contexts: list[list[int]],
    *,
    temperature: float,
    max_new_tokens: int,
    stop_ids: list[int],
    pad_id: int,
) -> list[list[int]]:
    """One sampled continuation per context, each cut after its first stop token.

    Contexts of unequal length are left-padded and masked; `generate` then numbers positions
    from each row's first real token, so every row sees exactly the positions it would alone
    (equal to float rounding; equal lengths need no padding at all). A continuation without a
    stop token ran out of `max_new_tokens`.
    """
    samples = sample_batch(
        model,
        contexts,
        GlobalRng(),
        Sampling(temperature=temperature, max_new_tokens=max_new_tokens),
        eos_ids=stop_ids,
        pad_id=pad_id,
    )
    return [s.response_ids for s in samples]


def sample_responses(
    model: GPT2LMHeadModel,
    tokenizer: PreTrainedTokenizerFast,
    prompts: list[str],
    *,
    temperature: float,
    max_new_tokens: int,
) -> list[list[int]]:
    """Token ids of one response per prompt (a group: the same prompt N times), each ending at
    `<end>` unless it ran out of tokens."""
    return sample_continuations(
        model,
        [tokenizer.encode(p, add_special_tokens=False) for p in prompts],
        temperature=temperature,
        max_new_tokens=max_new_tokens,
        stop_ids=[tokenizer.eos_token_id],
        pad_id=tokenizer.pad_token_id,
    )


def sample_tool_responses(
    model: GPT2LMHeadModel,
    tokenizer: PreTrainedTokenizerFast,
    prompts: list[str],
    *,
    temperature: float,
    max_new_tokens: int,
) -> list[tuple[list[int], list[int]]]:
    """One multi-turn response per prompt as (response ids, mask) pairs.

    Each turn generates until `<end>` or `<call>`; after `<call>` the tool's output (the prompt's
    digits sorted, in brackets) is appended with mask 0 and the next turn starts.
    `max_new_tokens` bounds the whole response, tool output included. Contexts of equal length
    continue as one batch.
    """
    call_id = tokenizer.convert_tokens_to_ids(CALL)
    prompt_ids = [tokenizer.encode(p, add_special_tokens=False) for p in prompts]
    tool_ids = [
        tokenizer.encode(tool_output(parse_prompt(p).digits), add_special_tokens=False)
        for p in prompts
    ]
    responses: list[list[int]] = [[] for _ in prompts]
    masks: list[list[int]] = [[] for _ in prompts]
    active = list(range(len(prompts)))  # responses not yet ended (no turn yet, or a tool call)
    while active:
        by_length: dict[int, list[int]] = {}
        for i in active:
            by_length.setdefault(len(responses[i]), []).append(i)
        active = []
        for length in sorted(by_length):
            members = by_length[length]
            budget = max_new_tokens - length
            if budget <= 0:
                continue
            turns = sample_continuations(
                model,
                [prompt_ids[i] + responses[i] for i in members],
                temperature=temperature,
                max_new_tokens=budget,
                stop_ids=[tokenizer.eos_token_id, call_id],
                pad_id=tokenizer.pad_token_id,
            )
            for i, turn in zip(members, turns, strict=True):
                responses[i] += turn
                masks[i] += [1] * len(turn)
                # A tool reply that would not fit ends the response (unfinished, so wrong):
                # prompt + response must stay within the model's positions.
                room = max_new_tokens - len(responses[i]) - len(tool_ids[i])
                if turn and turn[-1] == call_id and room > 0:
                    responses[i] += tool_ids[i]
                    masks[i] += [0] * len(tool_ids[i])
                    active.append(i)
    return list(zip(responses, masks, strict=True))


def rollout_rows(
    tokenizer: PreTrainedTokenizerFast,
    group: str,
    prompt: str,
    responses: list[list[int]],
    *,
    temperature: float,
    step: int,
    masks: list[list[int]] | None = None,
) -> list[dict]:
    """Rollout rows (the project's JSONL format) for one group, rewards from the verifier."""
    problem = parse_prompt(prompt)
    prompt_ids = tokenizer.encode(prompt, add_special_tokens=False)
    rows = []
    for j, response_ids in enumerate(responses):
        response = tokenizer.decode(response_ids, skip_special_tokens=False)
        row = {
            "group": group,
            "prompt": prompt,
            "response": response,
            "prompt_ids": prompt_ids,
            "response_ids": response_ids,
            "reward": verify(prompt, response),
            "temperature": temperature,
            "step": step,
            "op": problem.op,
            "digits": len(problem.digits),
        }
        if masks is not None:
            row["mask"] = masks[j]
        rows.append(row)
    return rows


def sample_groups(
    model: GPT2LMHeadModel,
    tokenizer: PreTrainedTokenizerFast,
    prompts: list[str],
    *,
    group_size: int,
    temperature: float,
    max_new_tokens: int,
    step: int,
    on_group: Callable[[], None] | None = None,
    together: bool = False,
) -> list[dict]:
    """Rollout rows: `group_size` verifier-scored responses per prompt, groups `g00`, `g01`, ...
    `on_group` is called after each group (a progress bar's update).

    `together` samples every group in one padded batch: one `generate` loop instead of one per
    group, which is what makes long responses affordable on a CPU (the loop's per-token
    overhead dominates a small model). It draws the same distribution in another order, so a
    seed gives other rows than group by group."""

    def sample(group_prompts: list[str]) -> list[list[int]]:
        return sample_responses(
            model, tokenizer, group_prompts, temperature=temperature, max_new_tokens=max_new_tokens
        )

    if together:
        flat = sample([p for p in prompts for _ in range(group_size)])
        per_group: Iterable[list[list[int]]] = (
            flat[g * group_size : (g + 1) * group_size] for g in range(len(prompts))
        )
    else:  # lazily, so `on_group` follows the sampling
        per_group = (sample([p] * group_size) for p in prompts)
    rows: list[dict] = []
    for g, (prompt, responses) in enumerate(zip(prompts, per_group, strict=True)):
        rows += rollout_rows(
            tokenizer, f"g{g:02d}", prompt, responses, temperature=temperature, step=step
        )
        if on_group is not None:
            on_group()
    return rows
