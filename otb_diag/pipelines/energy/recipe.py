"""`otb-diag energy` end to end: load, measure, tabulate, plot, write. The maths lives in
`maths/energy/tables.py` and below, the chunked measuring loop in `measure.py`; every output is
staged and moved into `--out` only once all of them are written, so a bad input, a failed rank
or Ctrl-C never leaves a half-written output directory."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from otb_diag.io.provenance import library_versions
from otb_diag.io.rollouts.probability_checks import TOLERANCE
from otb_diag.pipelines.energy.measure import Measured, measure_and_write
from otb_diag.pipelines.energy.settings import EnergySettings as EnergySettings
from otb_diag.pipelines.inputs import EnergyInputs, Say, silent
from otb_diag.pipelines.results.energy import (
    AdvantageAudit,
    AuditSkipped,
    Consistency,
    EnergyResult,
    EnergyStats,
    EnergyTotals,
)
from otb_diag.pipelines.results.schema import Distributed, RunInputs, build
from otb_diag.pipelines.shell import Stage, run_recipe


def run_energy(
    inputs: EnergyInputs,
    out: Path,
    settings: EnergySettings = EnergySettings(),
    *,
    progress: bool = True,
    say: Say = silent,
) -> EnergyResult | None:
    """Measure the rollouts of `inputs` under each of its checkpoints (model-free, from the
    rollouts' own logprobs and sum_pi2, with `inputs.model_free`), write tokens.parquet,
    sequences.csv, groups.csv, proxies.json, the figures and summary.json into `out`, and return
    the result (summary.json is its `to_json()`). An omitted --ckpt or --rollouts is the
    scenario's, said through `say`, as are prompts tokenized without the chat template.

    The rollouts stream through in chunks of groups (`io/rollouts/stream.py`), so memory is set
    by a chunk, not by the file. Under torchrun every rank measures its share of each chunk's
    groups (balanced by tokens) and rank 0 alone writes, exactly the files of one process; the
    other ranks return None."""
    settings.check()  # before a default file is looked up (each knob's when it was built)
    rollouts_path = inputs.rollouts_path(say)
    if inputs.model_free and inputs.ckpt:
        say("--model-free given: ignoring --ckpt")
    checkpoints = [] if inputs.model_free else inputs.checkpoint_dirs(say)
    result = _measure(checkpoints, rollouts_path, out, settings, progress, say)
    untemplated = result.totals.prompts_without_chat_template if result is not None else 0
    if untemplated:
        say(
            f"note: {untemplated} prompts were tokenized without the checkpoint's chat template; "
            "trainers dump text without special tokens, so if the trainer applied the template, "
            "pass --chat-template (or dump exact ids: see the README)"
        )
    return result


def _measure(
    checkpoints: list[Path],
    rollouts_path: Path,
    out: Path,
    settings: EnergySettings,
    progress: bool,
    say: Say,
) -> EnergyResult | None:
    """`run_energy` on resolved files (model-free when `checkpoints` is empty), in the recipe
    shell (`otb_diag/pipelines/shell.py:run_recipe`)."""

    def body(stage: Stage) -> EnergyResult | None:
        assert stage.into is not None  # energy writes a folder
        measured = measure_and_write(
            checkpoints, rollouts_path, stage.into, settings, stage.progress, stage.say
        )
        return None if measured is None else _result(measured, settings, out)

    load = settings.load if checkpoints else None  # model-free: no model, gloo on the CPU
    return run_recipe(body, out=out, load=load, progress=progress, say=say)


def _result(m: Measured, settings: EnergySettings, out: Path) -> EnergyResult:
    final = m.results[-1]
    seqs, groups = final.sequences, final.groups
    n_tokens = sum(r.tokens for r in m.results)
    empty = seqs["generated"] == 0  # aborted generations, kept
    energies = seqs.loc[~empty, "energy"]
    return EnergyResult(
        mode="model" if m.results[0].checkpoint else "model-free",
        inputs=RunInputs.of(m.rollouts.record, [r.checkpoint for r in m.results if r.checkpoint]),
        settings=replace(m.settings, tir=m.tir),
        totals=EnergyTotals(
            responses=len(seqs),
            groups=len(groups),
            response_tokens=int(seqs["length"].sum()),
            generated_tokens=int(seqs["generated"].sum()),
            checkpoints=len(m.results),
            round_trip_issues=final.round_trip_issues,
            prompts_without_chat_template=final.untemplated_prompts,
            empty_responses=int(empty.sum()),
            groups_with_empty_responses=list(groups.loc[groups["empty_responses"] > 0, "group"]),
        ),
        consistency=Consistency(TOLERANCE, dict(m.clamped)),
        advantage_audit=build(AdvantageAudit | AuditSkipped | None, final.audit),
        energy=EnergyStats(
            step=final.step,
            sequence_energy_mean=float(seqs["energy"].mean()),
            sequence_energy_median=float(seqs["energy"].median()),
            # over the responses with a token: an empty one's W = 0 would make it infinite
            sequence_energy_max_min_ratio=float(energies.max() / energies.min()),
            mean_w=float(seqs["energy"].sum() / max(1, seqs["generated"].sum())),
            group_energy_cv_median=float(groups["energy_cv"].median()),
            groups_with_mixed_rewards=int(groups["mixed_rewards"].sum()),
            zero_tail_tokens=int(groups["zero_tail_tokens"].sum()),
        ),
        proxies=final.proxies,
        figure_group=m.group,
        distributed=Distributed(len(m.rank_tokens), m.rank_tokens),
        timings={**m.timings, "tokens_per_second": n_tokens / max(m.timings["measure_s"], 1e-9)},
        versions=library_versions(),
        out=str(out.resolve()),
        outputs=m.outputs + ["summary.json"],
    )
