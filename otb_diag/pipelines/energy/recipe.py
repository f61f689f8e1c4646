"""`otb-diag energy` end to end: load, measure, tabulate, plot, write. The maths lives in
`maths/energy/tables.py` and below, the chunked measuring loop in `stream.py`; every output is
staged and moved into `--out` only once all of them are written, so a bad input, a failed rank
or Ctrl-C never leaves a half-written output directory."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Any

from otb_diag.errors import InputError
from otb_diag.io.atomic import staged_output, write_json
from otb_diag.io.loading import rollouts_record
from otb_diag.io.provenance import library_versions
from otb_diag.io.rollouts.probability_checks import TOLERANCE
from otb_diag.pipelines.energy.settings import EnergySettings as EnergySettings
from otb_diag.pipelines.energy.stream import Measured, measure_and_write
from otb_diag.runtime.devices import resolve_device
from otb_diag.runtime.torchrun import session


def run_energy(
    checkpoints: list[Path],
    rollouts_path: Path,
    out: Path,
    settings: EnergySettings = EnergySettings(),
    *,
    progress: bool = True,
) -> dict[str, Any] | None:
    """Measure the rollouts under each checkpoint (model-free when `checkpoints` is empty), write
    tokens.parquet, sequences.csv, groups.csv, proxies.json, the figures and summary.json into
    `out`, and return the summary.

    The rollouts stream through in chunks of groups (`io/rollouts/stream.py`), so memory is set
    by a chunk, not by the file. Under torchrun every rank measures its share of each chunk's
    groups (balanced by tokens) and rank 0 alone writes, exactly the files of one process; the
    other ranks return None."""
    settings.check()
    if checkpoints:
        settings.load.check()
    backend_device = resolve_device(settings.load.device).type if checkpoints else "cpu"
    with session(backend_device) as d:
        if d.world_size > 1 and settings.load.device_map is not None:
            raise InputError(
                "--device-map spreads one model over the GPUs of one process; under torchrun "
                "every rank loads a whole model on its own GPU.",
                field="device-map",
                hint="Use one or the other.",
            )
        if not d.is_main:
            measure_and_write(d, checkpoints, rollouts_path, out, settings, progress)
            return None
        with staged_output(out) as stage:
            measured = measure_and_write(d, checkpoints, rollouts_path, stage, settings, progress)
            assert measured is not None  # rank 0
            summary = _summary(measured, settings, out, d.world_size)
            write_json(stage / "summary.json", summary)
        return summary


def _summary(m: Measured, settings: EnergySettings, out: Path, world_size: int) -> dict[str, Any]:
    final = m.results[-1]
    seqs, groups = final.sequences, final.groups
    n_tokens = sum(r.tokens for r in m.results)
    return {
        "command": "energy",
        "mode": "model" if m.results[0].checkpoint else "model-free",
        "inputs": {
            "rollouts": rollouts_record(m.index.shell),
            "checkpoints": [r.checkpoint for r in m.results if r.checkpoint],
        },
        "settings": {**asdict(settings), "tir": m.tir},
        "totals": {
            "responses": len(seqs),
            "groups": len(groups),
            "response_tokens": int(seqs["length"].sum()),
            "generated_tokens": int(seqs["generated"].sum()),
            "checkpoints": len(m.results),
            "round_trip_issues": final.round_trip_issues,
            "prompts_without_chat_template": final.untemplated_prompts,
        },
        "consistency": {"tolerance": TOLERANCE, "clamped": dict(m.clamped)},
        "advantage_audit": final.audit,
        "energy": {
            "step": final.step,
            "sequence_energy_mean": float(seqs["energy"].mean()),
            "sequence_energy_median": float(seqs["energy"].median()),
            "sequence_energy_max_min_ratio": float(seqs["energy"].max() / seqs["energy"].min()),
            "mean_w": float(seqs["energy"].sum() / max(1, seqs["generated"].sum())),
            "group_energy_cv_median": float(groups["energy_cv"].median()),
            "groups_with_mixed_rewards": int(groups["mixed_rewards"].sum()),
        },
        "proxies": final.proxies,
        "figure_group": m.group,
        "distributed": {"world_size": world_size, "rank_tokens": m.rank_tokens},
        "timings": {
            **m.timings,
            "tokens_per_second": n_tokens / max(m.timings["measure_s"], 1e-9),
        },
        "versions": library_versions(),
        "out": str(out.resolve()),
        "outputs": m.outputs + ["summary.json"],
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
