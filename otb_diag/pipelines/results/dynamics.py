"""The result of `otb-diag dynamics`: collapse.json's content as fields, and the text it prints."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from otb_diag.dynamics.units import MIXED_UNITS
from otb_diag.pipelines.results import schema


@dataclass(frozen=True)
class DynamicsResult(schema.Versioned):
    """What `otb-diag dynamics` found (`to_json()` is its collapse.json). `runs`: one row per
    training log (file, baseline, N, steps, collapse and warning steps, lead, tokens to target,
    the variance proxy's kind and units), the rows `plots/dynamics.py` draws from."""

    command: ClassVar[str] = "dynamics"

    rule: dict[str, Any]  # DetectionRule's parameters and its description
    target: float | None
    runs: list[dict[str, Any]]
    outputs: str  # the output directory

    def format(self) -> str:
        """One line per run, then the rule and where the outputs are."""
        target = self.target
        tokens_head = f"tokens to {target:g}" if target is not None else "tokens to target"
        head = (
            f"{'run':<20} {'baseline':<8} {'N':>4} {'steps':>11} {'collapse':>9} {'warning':>8} "
            f"{'lead':>5} {tokens_head:>15}  variance proxy"
        )
        lines = [head]
        for r in self.runs:
            lines.append(
                f"{r['run'][:20]:<20} {_cell(r['baseline']):<8} {_cell(r['group_size']):>4} "
                f"{r['first_step']:>5}-{r['last_step']:<5} {_cell(r['collapse_step']):>9} "
                f"{_cell(r['warning_step']):>8} {_cell(r['lead_steps']):>5} "
                f"{_cell(r['tokens_to_target'], '{:.3g}'):>15}  {r['variance_proxy_kind']}"
            )
        mixed = [r["run"] for r in self.runs if r.get("proxy3_mixes_units")]
        if mixed:
            lines.append(f"note ({', '.join(mixed)}): {MIXED_UNITS}.")
        lines.append(f"rule: {self.rule['description']}")
        figures = 4 if any("otb" in r for r in self.runs) else 3  # + the live diagnostics'
        lines.append(f"wrote dynamics.csv, collapse.json and {figures} figures to {self.outputs}")
        return "\n".join(lines)


def _cell(value: Any, fmt: str = "{}") -> str:
    return "—" if value is None else fmt.format(value)
