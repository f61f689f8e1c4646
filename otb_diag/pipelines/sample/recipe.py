"""`otb-diag rollouts sample`: pools of N responses per prompt from a checkpoint, in the rollout
format (docs/sampling.md).

1. check every setting, resolve the verifier, read the prompts (`otb_diag/io/prompts.py`);
2. load the checkpoint, tokenize each prompt (chat template when the tokenizer has one) and check
   it fits the model's context with `max_new_tokens`: all bad input stops here, nothing written;
3. plan: the (prompt, sample) pairs in order, cut into batches whose left-padded size
   `rows · (longest prompt + max_new_tokens)` fits `batch_tokens`; the plan depends only on the
   prompts and the settings, and each response has its own seed `row_seed(seed, prompt, sample)`;
4. each batch is sampled (`otb_diag/policy/sampling.py:sample_batch`, which records `logprobs`
   and `sum_pi2`) and written as one part file in `OUT/.sample-parts/`; `resume` skips the
   batches whose part is there, so a killed run resumed writes exactly an uninterrupted run's
   pools;
5. rewards from the verifier (one that raises names the prompt and response and stops before
   anything is written), then `rollouts.jsonl` and `manifest.json` move into OUT together and
   the parts go.

Under torchrun (`otb_diag/runtime/torchrun.py`) every rank reads the prompts, loads the model and
makes the same plan; the batches still to sample, as rank 0 finds them, are split across the
ranks by their padded size (`otb_diag/runtime/sharded.py:shard`), so each prompt's responses come
from the same batches, seeds and padding as in one process and the pools are byte-identical to
its. A rank writes only the parts of its own batches (a part is named by its batch), and scores
a share of them with the verifier; rank 0 waits for all (each step is a phase every rank agrees
on: an error on any rank stops every rank with it), reads every part and writes
`rollouts.jsonl` and `manifest.json` as one process would. OUT must be on a filesystem that every
rank sees (any folder, on one node).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from otb_diag.errors import InputError, Interrupted
from otb_diag.io.atomic import write_json, write_jsonl
from otb_diag.io.prompts import PromptRow, read_prompts, tokenize_prompt
from otb_diag.io.provenance import file_sha256, library_versions
from otb_diag.pipelines.inputs import SampleInputs, Say, silent
from otb_diag.pipelines.results.sample import MANIFEST, ROLLOUTS, SampleResult
from otb_diag.pipelines.results.schema import Distributed, counted, groups_of_one
from otb_diag.pipelines.sample.settings import SampleSettings as SampleSettings
from otb_diag.pipelines.sample.verifiers import (
    Verifier,
)
from otb_diag.pipelines.shell import Stage, run_recipe
from otb_diag.policy.noise import RowNoise
from otb_diag.policy.sampling import row_seed, sample_batch
from otb_diag.runtime.sharded import Part, shard
from otb_diag.runtime.torchrun import agreed

PARTS = ".sample-parts"


def plan_batches(
    prompt_lengths: list[int], n: int, max_new: int, budget: int
) -> list[list[tuple[int, int]]]:
    """The (prompt, sample) pairs in order, cut into consecutive batches whose left-padded size
    `rows · (max prompt length + max_new)` is at most `budget` (a batch has at least one row)."""
    batches: list[list[tuple[int, int]]] = []
    width = 0
    for i, length in enumerate(prompt_lengths):
        for j in range(n):
            if batches:
                new_width = max(width, length + max_new)
                if (len(batches[-1]) + 1) * new_width <= budget:
                    batches[-1].append((i, j))
                    width = new_width
                    continue
            batches.append([(i, j)])
            width = length + max_new
    return batches


def run_sample(
    inputs: SampleInputs,
    out: Path,
    settings: SampleSettings,
    *,
    progress: bool = True,
    say: Say = silent,
) -> SampleResult | None:
    """Sample the pools of `inputs` (the prompts, from its checkpoint: the embedded default,
    said through `say`, when none; see the module docstring) into `out`; returns the result,
    manifest.json's content (None on the ranks other than 0 under torchrun). With
    `settings.resume`, finishes a killed run's parts in `out`. Raises `InputError` for bad
    input, before writing; Ctrl-C raises `Interrupted`, saying what was kept and how to
    resume."""
    verifier = settings.check()
    ckpt = inputs.checkpoint(say)
    try:
        result = run_recipe(
            lambda stage: _run(ckpt, inputs.prompts, out, stage, settings, verifier),
            out=out,
            load=settings.load,
            record=MANIFEST,
            progress=progress,
            say=say,
        )
    except KeyboardInterrupt:
        raise Interrupted(how_to_resume(out)) from None
    if result is not None:  # the pools are in `out`: their parts go
        shutil.rmtree(out / PARTS, ignore_errors=True)
    return result


def how_to_resume(out: Path) -> str:
    """What an interrupted run kept in `out` and how to finish it."""
    parts = out / PARTS
    if not parts.is_dir():
        return "Nothing was sampled yet: run the command again."
    done = len(list(parts.glob("part-*.jsonl")))
    return (
        f"{counted(done, 'finished batch', 'finished batches')} of responses kept in {parts}/: "
        "run the same command with --resume to sample only the rest (the pools are exactly "
        "those of an uninterrupted run)."
    )


def _run(
    ckpt: Path,
    prompts_path: Path,
    out: Path,
    stage: Stage,
    settings: SampleSettings,
    verifier: Verifier,
) -> SampleResult | None:
    started = time.perf_counter()
    parts = out / PARTS
    # Every rank checks OUT before the parts folder is created (a phase waits for all).
    prompts = _read_and_check(prompts_path, out, settings, verifier)
    if settings.n == 1:  # groups of one: a group baseline has nothing to compare
        stage.say(groups_of_one(len(prompts), len(prompts)) or "")
    job = _prepare(ckpt, prompts, prompts_path, settings)
    if not settings.sampling.from_policy:
        stage.say(
            "note: --top-k/--top-p truncate the policy; logprobs and sum_pi2 are those of the "
            "untruncated softmax(z/τ), and the variance theory assumes samples from it "
            "(manifest: from_policy false)"
        )
    _open_parts(parts, job.identity)
    # What is left to sample (the plan is rank 0's view of the parts: every rank splits it).
    todo = [k for k in range(len(job.batches)) if not _part(parts, k).is_file()]
    everything = range(len(job.batches))
    shards = shard([(k, job.costs[k]) for k in todo], [(k, job.costs[k]) for k in everything])
    tokens_per_rank = shards.run(
        lambda mine: _sample_parts(job, mine, settings, parts, stage.progress, shards.ranks),
        lambda sampled: [tokens for _, tokens in sampled],
    )
    # Each rank scores a share of all the batches (its own sampled ones on a fresh run).
    return shards.run(
        lambda mine: _score(parts, mine, job, verifier, settings, prompts_path),
        lambda scored: _assemble(
            stage, parts, prompts_path, job, scored, settings, tokens_per_rank or [], started
        ),
        r=1,
    )


@dataclass(frozen=True)
class _Job:
    """What every rank holds before sampling: the prompts tokenized for the loaded model, and
    the plan (batches and their padded costs), identical on every rank."""

    prompts: list[PromptRow]
    prompt_ids: list[list[int]]
    tokenizer: Any
    model: Any
    eos_ids: list[int]
    pad_id: int
    batches: list[list[tuple[int, int]]]
    costs: list[int]  # a batch's padded size: rows · (longest prompt + max_new_tokens)
    identity: dict[str, Any]  # what a resumed run must share with this one


@agreed
def _prepare(
    ckpt: Path, prompts: list[PromptRow], prompts_path: Path, settings: SampleSettings
) -> _Job:
    """Load the checkpoint, tokenize and check every prompt, and plan the batches."""
    loaded = settings.load.load(ckpt)
    tokenizer, model = loaded.tokenizer, loaded.model
    ids = [tokenize_prompt(tokenizer, p, settings.chat_template, prompts_path) for p in prompts]
    max_new = settings.sampling.max_new_tokens
    _check_lengths(prompts, ids, model, max_new, prompts_path)
    eos_ids = _eos_ids(tokenizer, model)
    batches = plan_batches([len(p) for p in ids], settings.n, max_new, settings.batch_tokens)
    return _Job(
        prompts=prompts,
        prompt_ids=ids,
        tokenizer=tokenizer,
        model=model,
        eos_ids=eos_ids,
        pad_id=tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos_ids[0],
        batches=batches,
        costs=[len(b) * (max(len(ids[i]) for i, _ in b) + max_new) for b in batches],
        identity={
            **settings.identity(),
            "prompts_sha256": file_sha256(prompts_path) if prompts_path.is_file() else None,
            "checkpoint": str(loaded.path),
        },
    )


def _score(
    parts: Path,
    batches: list[int],
    job: _Job,
    verifier: Verifier,
    settings: SampleSettings,
    prompts_path: Path,
) -> dict[tuple[int, int], float]:
    """The verifier's rewards of the samples of `batches`, read from their parts."""
    samples = _read_parts(parts, batches)
    return _rewards(job.prompts, samples, job.tokenizer, verifier, settings, prompts_path)


def _assemble(
    stage: Stage,
    parts: Path,
    prompts_path: Path,
    job: _Job,
    scored: list[Part[int, dict[tuple[int, int], float]]],
    settings: SampleSettings,
    tokens_per_rank: list[int],
    started: float,
) -> SampleResult:
    """Rank 0: every part read back in order, the rows with the ranks' rewards (by prompt and
    sample), rollouts.jsonl written into the stage (manifest.json beside it, and both moved
    into OUT together, by the shell). Returns the manifest's result."""
    all_rewards = {k: v for _, share in scored for k, v in share.items()}
    samples = _read_parts(parts, range(len(job.batches)))
    rows = _rows(job.prompts, job.prompt_ids, samples, all_rewards, job.tokenizer, settings)
    result = SampleResult(
        checkpoint=job.identity["checkpoint"],
        prompts=str(prompts_path.resolve()),
        prompts_sha256=job.identity["prompts_sha256"],
        prompts_count=len(job.prompts),
        responses=len(rows),
        settings={**settings.identity(), "from_policy": settings.sampling.from_policy},
        batches=len(job.batches),
        truncated=sum(r["truncated"] for r in rows),
        mean_reward=sum(r["reward"] for r in rows) / len(rows),
        generated_tokens=sum(len(r["response_ids"]) for r in rows),
        seconds=time.perf_counter() - started,
        sampled_tokens_this_run=sum(tokens_per_rank),
        distributed=Distributed(world_size=len(tokens_per_rank), rank_tokens=tokens_per_rank),
        versions=library_versions(),
    )
    assert stage.into is not None  # sample writes a folder
    write_jsonl(stage.into / ROLLOUTS, rows)
    return result


@agreed
def _read_and_check(
    prompts_path: Path, out: Path, settings: SampleSettings, verifier: Verifier
) -> list[PromptRow]:
    """The prompts, once they and OUT are fit for this run."""
    prompts = read_prompts(prompts_path, settings.prompt_column, settings.answer_column)
    if verifier.needs_answer:
        missing = next((p for p in prompts if p.answer is None), None)
        if missing is not None:
            column = settings.answer_column or "answer"
            raise missing.error(
                prompts_path,
                f"verifier '{settings.verifier}' needs an answer, and this prompt has none",
                column,
                "Name the answer column with --answer-column.",
            )
    if (out / ROLLOUTS).exists():
        raise InputError(
            "already holds sampled pools (rollouts.jsonl)",
            path=out,
            hint="Choose another --out, or remove it.",
        )
    if (out / PARTS).exists() and not settings.resume:
        raise InputError(
            f"holds a partial run ({PARTS}/)",
            path=out,
            hint="Pass --resume to finish it, or choose another --out.",
        )
    return prompts


def _check_lengths(
    prompts: list[PromptRow], ids: list[list[int]], model: Any, max_new: int, path: Path
) -> None:
    config = model.config.get_text_config()
    context = getattr(config, "max_position_embeddings", None) or getattr(
        config, "n_positions", None
    )
    for row, prompt_ids in zip(prompts, ids, strict=True):
        if not prompt_ids:
            raise row.error(path, "the prompt tokenizes to no tokens", "prompt")
        if context is not None and len(prompt_ids) + max_new > context:
            raise row.error(
                path,
                f"the prompt is {len(prompt_ids)} tokens, and with --max-new-tokens {max_new} "
                f"it exceeds the model's context of {context} positions",
                "prompt",
                "Shorten the prompt or lower --max-new-tokens.",
            )


def _eos_ids(tokenizer: Any, model: Any) -> list[int]:
    """The end-of-sequence ids: the tokenizer's and those of the model's generation config."""
    found = [tokenizer.eos_token_id]
    config_eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    found += config_eos if isinstance(config_eos, list) else [config_eos]
    ids = list(dict.fromkeys(int(i) for i in found if i is not None))
    if not ids:
        raise InputError("the tokenizer has no end-of-sequence token", field="eos_token")
    return ids


@agreed
def _open_parts(parts: Path, identity: dict[str, Any]) -> None:
    """Create the parts folder with its plan, or check a resumed one was made by the same
    settings, prompts and checkpoint. Every rank does (one phase): the plan is written
    atomically, with the same content by each."""
    plan = parts / "plan.json"
    if plan.is_file():
        before = json.loads(plan.read_text(encoding="utf-8"))
        if before != json.loads(json.dumps(identity)):
            changed = sorted(k for k in identity if before.get(k) != identity[k])
            raise InputError(
                f"--resume: the partial run was made with other settings ({', '.join(changed)})",
                path=plan,
                hint="Resume with the same options, or choose another --out.",
            )
        return
    parts.mkdir(parents=True, exist_ok=True)
    write_json(plan, identity)


def _part(parts: Path, k: int) -> Path:
    return parts / f"part-{k:06d}.jsonl"


def _sample_parts(
    job: _Job,
    mine: list[int],
    settings: SampleSettings,
    parts: Path,
    progress: bool,
    ranks: int,
) -> int:
    """Sample the batches `mine` (this rank's share of those without a part file, of `ranks`),
    one part each; returns the tokens generated. Only rank 0 shows a bar (`progress`): the
    responses of every rank, counted from the parts on disk (so its rate and ETA are the
    job's), and its own tokens/s."""
    from tqdm.auto import tqdm

    batches = job.batches
    total = sum(len(b) for b in batches)
    desc = "sampling" if ranks == 1 else f"sampling, {ranks} ranks"
    bar = tqdm(
        total=total,
        initial=_done_rows(parts, batches),
        unit="resp",
        desc=desc,
        disable=not progress,
        dynamic_ncols=True,
    )
    generated, start = 0, time.perf_counter()
    for k in mine:
        pairs = batches[k]
        samples = sample_batch(
            job.model,
            [job.prompt_ids[i] for i, _ in pairs],
            RowNoise([row_seed(settings.seed, i, j) for i, j in pairs]),
            settings.sampling,
            eos_ids=job.eos_ids,
            pad_id=job.pad_id,
        )
        write_jsonl(
            _part(parts, k),
            [
                {"prompt": i, "sample": j, **asdict(s)}
                for (i, j), s in zip(pairs, samples, strict=True)
            ],
        )
        generated += sum(len(s.response_ids) for s in samples)
        if not bar.disable:
            bar.update(_done_rows(parts, batches) - bar.n)
            rate = f"{generated / (time.perf_counter() - start):.0f}"
            bar.set_postfix(
                {"prompt": pairs[-1][0] + 1, "tok/s" if ranks == 1 else "rank0 tok/s": rate}
            )
    bar.close()
    return generated


_PART_NAME = re.compile(r"part-(\d{6})\.jsonl")


def _done_rows(parts: Path, batches: list[list[tuple[int, int]]]) -> int:
    """Responses in the parts written so far, by any rank."""
    names = (_PART_NAME.fullmatch(name) for name in os.listdir(parts))
    return sum(len(batches[int(m[1])]) for m in names if m and int(m[1]) < len(batches))


def _read_parts(parts: Path, which: Any) -> dict[tuple[int, int], dict[str, Any]]:
    """The samples of the batches `which`, by (prompt, sample)."""
    samples = {}
    for k in which:
        path = _part(parts, k)
        if not path.is_file():
            raise InputError(
                f"batch {k}'s part is missing: another rank wrote it where this one cannot see it",
                path=parts,
                hint="Under torchrun on several nodes, --out must be on a shared filesystem.",
            )
        for line in path.read_text(encoding="utf-8").splitlines():
            record = json.loads(line)
            samples[(record["prompt"], record["sample"])] = record
    return samples


def _rewards(
    prompts: list[PromptRow],
    samples: dict[tuple[int, int], dict[str, Any]],
    tokenizer: Any,
    verifier: Verifier,
    settings: SampleSettings,
    path: Path,
) -> dict[tuple[int, int], float]:
    """The verifier's reward for each sample, in (prompt, sample) order; one that raises or
    returns a non-finite value names the prompt and the response."""
    rewards = {}
    for i, j in sorted(samples):
        prompt = prompts[i]
        response = tokenizer.decode(samples[(i, j)]["response_ids"], skip_special_tokens=True)
        try:
            reward = float(verifier(prompt.text, response, prompt.answer))
        except InputError:
            raise
        except Exception as err:
            raise prompt.error(
                path,
                f"the verifier '{settings.verifier}' failed on response {j} of this prompt: "
                f"{type(err).__name__}: {err}",
                settings.answer_column or "answer",
                "Nothing was written; the samples are kept, so fix the verifier and pass --resume.",
            ) from None
        if reward != reward or reward in (float("inf"), float("-inf")):
            raise prompt.error(
                path,
                f"the verifier '{settings.verifier}' returned {reward} for response {j}",
                "reward",
            )
        rewards[(i, j)] = reward
    return rewards


def _rows(
    prompts: list[PromptRow],
    prompt_ids: list[list[int]],
    samples: dict[tuple[int, int], dict[str, Any]],
    rewards: dict[tuple[int, int], float],
    tokenizer: Any,
    settings: SampleSettings,
) -> list[dict[str, Any]]:
    """The rollout rows, one group per prompt."""
    s = settings.sampling
    rows = []
    for prompt in prompts:
        for j in range(settings.n):
            sample = samples[(prompt.index, j)]
            rows.append(
                {
                    "group": f"p{prompt.index:05d}",
                    "sample": j,
                    "prompt": prompt.text,
                    "response": tokenizer.decode(sample["response_ids"], skip_special_tokens=True),
                    "prompt_ids": prompt_ids[prompt.index],
                    "response_ids": sample["response_ids"],
                    "reward": rewards[(prompt.index, j)],
                    "answer": prompt.answer,
                    "logprobs": sample["logprobs"],
                    "sum_pi2": sample["sum_pi2"],
                    "truncated": sample["truncated"],
                    "temperature": s.temperature,
                    "top_p": s.top_p,
                    "top_k": s.top_k,
                    "max_new_tokens": s.max_new_tokens,
                    "seed": settings.seed,
                    "source": {"line": prompt.line}
                    if prompt.line is not None
                    else {"row": prompt.row},
                }
            )
    return rows
