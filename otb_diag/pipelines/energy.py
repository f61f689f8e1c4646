"""`otb-diag energy` end to end: load, measure, tabulate, plot, write. The maths lives in
`maths/energy.py` and below; this module only sequences it and writes every output atomically, after
all the measuring is done, so a bad input never leaves a half-written output directory."""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import pandas as pd
from tqdm.auto import tqdm

from otb_diag.errors import InputError
from otb_diag.io.atomic import write_json, write_with
from otb_diag.io.batch import make_batch
from otb_diag.io.consistency import TOLERANCE
from otb_diag.io.inputs import (
    LoadOptions,
    checkpoint_batch,
    checkpoint_record,
    load_rollouts,
    response_tokens,
    rollouts_record,
)
from otb_diag.io.provenance import library_versions
from otb_diag.io.rollouts import Rollouts, prompts_without_template
from otb_diag.maths.audit import TRAINER_BASELINES, advantage_audit
from otb_diag.maths.energy import (
    DEFAULT_BASELINES,
    EnergyTables,
    checkpoint_stats,
    energy_tables,
    logged_stats,
    pick_group,
    tir_needed,
)
from otb_diag.plots import energy as plots
from otb_diag.plots.style import save_figure


@dataclass(frozen=True)
class EnergySettings:
    """Every knob of `otb-diag energy` (the CLI's options, with the same defaults)."""

    baselines: tuple[str, ...] = DEFAULT_BASELINES
    temperature: float | None = None  # overrides the rollouts' own τ when set
    batch_tokens: int = 16384
    chunk_size: int = 256
    group: str | None = None
    handle_zero_tail: bool = True
    tir: bool | None = None  # None: on when any response holds tool output (mask 0)
    load: LoadOptions = LoadOptions()
    steps: str | None = None  # "A-B": only rows of these training steps
    reward_columns: tuple[str, ...] | None = None  # TRL completion logs: the reward's columns
    trainer_baseline: str | None = None  # audit the trainer's advantages against this baseline


@dataclass
class _StepResult:
    step: int
    checkpoint: dict[str, Any] | None
    tables: EnergyTables
    vocab_size: int | None
    tir: bool
    round_trip_issues: int
    untemplated_prompts: int = 0
    audit: dict[str, Any] | None = None


def run_energy(
    checkpoints: list[Path],
    rollouts_path: Path,
    out: Path,
    settings: EnergySettings = EnergySettings(),
    *,
    progress: bool = True,
) -> dict[str, Any]:
    """Measure the rollouts under each checkpoint (model-free when `checkpoints` is empty), write
    tokens.parquet, sequences.csv, groups.csv, proxies.json, the figures and summary.json into
    `out`, and return the summary."""
    started = time.perf_counter()
    rollouts = load_rollouts(
        rollouts_path,
        settings.temperature,
        steps=settings.steps,
        reward_columns=list(settings.reward_columns) if settings.reward_columns else None,
    )
    tokens_per_pass = response_tokens(rollouts)
    bar = tqdm(
        total=tokens_per_pass * max(1, len(checkpoints)) if tokens_per_pass else None,
        unit="tok",
        unit_scale=True,
        desc="energy",
        disable=not progress,
    )
    timings = {"measure_s": 0.0}
    if checkpoints:
        results = []
        for i, path in enumerate(checkpoints):
            t0 = time.perf_counter()
            results.append(_measure_checkpoint(path, i, rollouts, settings, bar.update))
            timings["measure_s"] += time.perf_counter() - t0
    else:
        t0 = time.perf_counter()
        results = [_measure_model_free(rollouts, settings)]
        bar.update(tokens_per_pass or 0)
        timings["measure_s"] = time.perf_counter() - t0
    bar.close()

    final = results[-1]
    group = settings.group if settings.group is not None else pick_group(final.tables.groups)
    if group not in set(final.tables.groups["group"]):
        known = ", ".join(list(final.tables.groups["group"])[:8])
        raise InputError(
            f"no group '{group}' in the rollouts (groups: {known}, ...).",
            path=rollouts_path,
            field="group",
        )

    t0 = time.perf_counter()
    outputs = _write_outputs(out, results, group)
    timings["write_s"] = time.perf_counter() - t0
    timings["total_s"] = time.perf_counter() - started
    summary = _summary(rollouts, results, settings, group, timings, outputs, out)
    write_json(out / "summary.json", summary)
    return summary


def _measure_checkpoint(
    path: Path, index: int, rollouts: Rollouts, settings: EnergySettings, update
) -> _StepResult:
    ckpt, batch, issues = checkpoint_batch(path, rollouts, settings.load)
    stats = checkpoint_stats(
        ckpt.model,
        batch,
        batch_tokens=settings.batch_tokens,
        chunk_size=settings.chunk_size,
        progress=update,
    )
    tir = tir_needed(batch) if settings.tir is None else settings.tir
    tables = energy_tables(
        batch,
        stats,
        settings.baselines,
        token_text=ckpt.tokenizer.convert_ids_to_tokens,
        handle_zero_tail=settings.handle_zero_tail,
        tir=tir,
    )
    step = ckpt.step if ckpt.step is not None else index
    untemplated = (
        0 if settings.load.chat_template else prompts_without_template(rollouts, ckpt.tokenizer)
    )
    audit = _audit(batch, stats.w, rollouts, settings, tir)
    return _StepResult(
        step, checkpoint_record(ckpt), tables, ckpt.vocab_size, tir, issues, untemplated, audit
    )


def _audit(batch, w, rollouts: Rollouts, settings: EnergySettings, tir: bool) -> dict | None:
    """The advantage audit (`maths/audit.py`) against the trainer's registry baseline: TRL's
    default for TRL completion logs, else `--trainer-baseline`; None without trainer
    advantages, a note when no baseline is known."""
    if batch.trainer_advantage is None:
        return None
    trainer = rollouts.format.split("-")[0]
    if settings.trainer_baseline is not None:
        baseline, options = settings.trainer_baseline, {}
    elif trainer in TRAINER_BASELINES:
        baseline, options = TRAINER_BASELINES[trainer]
    else:
        return {
            "skipped": "the rollouts carry trainer advantages but the trainer's estimator is "
            "unknown: name it with --trainer-baseline (verl: algorithm.adv_estimator)"
        }
    options = {"handle_zero_tail": settings.handle_zero_tail, "tir": tir, **options}
    result = advantage_audit(batch, w, baseline, **options)
    return None if result is None else {"trainer": trainer, **result}


def _measure_model_free(rollouts: Rollouts, settings: EnergySettings) -> _StepResult:
    if response_tokens(rollouts) is None:
        raise InputError(
            "model-free mode needs token ids (prompt_ids, response_ids) on every row; "
            "this file has text only.",
            path=rollouts.path,
            field="response_ids",
            hint="Give --ckpt so its tokenizer can tokenize the text.",
        )
    batch = make_batch(rollouts)
    stats = logged_stats(batch, path=str(rollouts.path))
    tir = tir_needed(batch) if settings.tir is None else settings.tir
    tables = energy_tables(
        batch, stats, settings.baselines, handle_zero_tail=settings.handle_zero_tail, tir=tir
    )
    audit = _audit(batch, stats.w, rollouts, settings, tir)
    return _StepResult(0, None, tables, None, tir, 0, 0, audit)


def _stacked(results: list[_StepResult], name: str) -> pd.DataFrame:
    """One table over all checkpoints, with a `step` column when there are several."""
    if len(results) == 1:
        return getattr(results[0].tables, name)
    return pd.concat(
        [getattr(r.tables, name).assign(step=r.step) for r in results], ignore_index=True
    )


def _write_outputs(out: Path, results: list[_StepResult], group: str) -> list[str]:
    out.mkdir(parents=True, exist_ok=True)
    tokens = _stacked(results, "tokens")
    sequences = _stacked(results, "sequences")
    write_with(out / "tokens.parquet", lambda p: tokens.to_parquet(p, index=False))
    write_with(out / "sequences.csv", lambda p: sequences.to_csv(p, index=False))
    groups = _stacked(results, "groups")
    write_with(out / "groups.csv", lambda p: groups.to_csv(p, index=False))
    proxies = (
        results[0].tables.proxies
        if len(results) == 1
        else {str(r.step): r.tables.proxies for r in results}
    )
    write_json(out / "proxies.json", proxies)
    files = ["tokens.parquet", "sequences.csv", "groups.csv", "proxies.json"]

    final = results[-1].tables
    shown = plots.spread_samples(final.sequences, group, count=8)
    figures = {
        "fig3_sequence_energy": plots.fig3_sequence_energy(final.sequences, group),
        "fig4_cumulative_energy": plots.fig4_cumulative_energy(final.tokens, shown, group),
        "fig5_probability_vs_gradient": plots.fig5_probability_vs_gradient(
            final.tokens, results[-1].vocab_size
        ),
    }
    if len(results) > 1:
        figures["fig_energy_by_step"] = plots.fig_energy_by_step(sequences)
    for name, fig in figures.items():
        files += [p.name for p in save_figure(fig, out, name)]
    return files


def _summary(
    rollouts: Rollouts,
    results: list[_StepResult],
    settings: EnergySettings,
    group: str,
    timings: dict[str, float],
    outputs: list[str],
    out: Path,
) -> dict[str, Any]:
    final = results[-1].tables
    seqs, groups = final.sequences, final.groups
    n_tokens = int(sum(len(r.tables.tokens) for r in results))
    return {
        "command": "energy",
        "mode": "model" if results[0].checkpoint else "model-free",
        "inputs": {
            "rollouts": rollouts_record(rollouts),
            "checkpoints": [r.checkpoint for r in results if r.checkpoint],
        },
        "settings": {**asdict(settings), "tir": results[-1].tir},
        "totals": {
            "responses": len(seqs),
            "groups": len(groups),
            "response_tokens": int(seqs["length"].sum()),
            "generated_tokens": int(seqs["generated"].sum()),
            "checkpoints": len(results),
            "round_trip_issues": results[-1].round_trip_issues,
            "prompts_without_chat_template": results[-1].untemplated_prompts,
        },
        "consistency": {"tolerance": TOLERANCE, "clamped": dict(rollouts.clamped)},
        "advantage_audit": results[-1].audit,
        "energy": {
            "step": results[-1].step,
            "sequence_energy_mean": float(seqs["energy"].mean()),
            "sequence_energy_median": float(seqs["energy"].median()),
            "sequence_energy_max_min_ratio": float(seqs["energy"].max() / seqs["energy"].min()),
            "mean_w": float(seqs["energy"].sum() / max(1, seqs["generated"].sum())),
            "group_energy_cv_median": float(groups["energy_cv"].median()),
            "groups_with_mixed_rewards": int(groups["mixed_rewards"].sum()),
        },
        "proxies": final.proxies,
        "figure_group": group,
        "timings": {**timings, "tokens_per_second": n_tokens / max(timings["measure_s"], 1e-9)},
        "versions": library_versions(),
        "out": str(out.resolve()),
        "outputs": outputs + ["summary.json"],
    }


def format_summary(summary: dict[str, Any]) -> str:
    """The short human summary `otb-diag energy` prints."""
    e, t = summary["energy"], summary["totals"]
    ckpts = summary["inputs"]["checkpoints"]
    lines = [
        f"rollouts     {summary['inputs']['rollouts']['path']}",
        "checkpoint   "
        + (ckpts[-1]["path"] if ckpts else "none (model-free)")
        + (f"  (+{len(ckpts) - 1} earlier)" if len(ckpts) > 1 else ""),
        f"measured     {t['responses']} responses in {t['groups']} groups, "
        f"{t['response_tokens']} tokens x {t['checkpoints']} checkpoint(s), "
        f"{summary['timings']['tokens_per_second']:.0f} tok/s",
        f"energy       mean W(τ) {e['sequence_energy_mean']:.3g}, median "
        f"{e['sequence_energy_median']:.3g}, max/min {e['sequence_energy_max_min_ratio']:.3g}, "
        f"mean w {e['mean_w']:.3g}",
        f"groups       median energy CV {e['group_energy_cv_median']:.3g}; "
        f"{e['groups_with_mixed_rewards']} of {t['groups']} have mixed rewards; "
        f"figures show group {summary['figure_group']}",
        "",
        f"{'baseline':<10} {'proxy2_total_power':>19} {'token_total_power':>18} "
        f"{'expected_a_squared':>19}",
    ]
    for name, p in summary["proxies"].items():
        lines.append(
            f"{name:<10} {p['proxy2_total_power']:>19.4g} {p['token_total_power']:>18.4g} "
            f"{p['expected_a_squared']:>19.4g}"
        )
    audit = summary.get("advantage_audit")
    if audit:
        lines += ["", format_audit(audit)]
    lines += ["", f"wrote {len(summary['outputs'])} files to {summary['out']}"]
    return "\n".join(lines)


def format_audit(audit: dict[str, Any]) -> str:
    """One line on the trainer's advantages against its documented estimator."""
    if "skipped" in audit:
        return f"advantages   not audited: {audit['skipped']}"
    eps = audit["options"].get("eps")
    verdict = (
        "agree"
        if audit["agrees"]
        else f"DIFFER (beyond {audit['tolerance']:.2g}; worst: response {audit['worst_response']})"
    )
    return (
        f"advantages   {audit['trainer']} logged vs registry '{audit['baseline']}'"
        + (f" (ε={eps:g})" if eps is not None else "")
        + f": max |Δ| {audit['max_abs_diff']:.3g}, mean |Δ| {audit['mean_abs_diff']:.3g} over "
        f"{audit['tokens']} tokens of {audit['responses']} responses: {verdict}"
    )
