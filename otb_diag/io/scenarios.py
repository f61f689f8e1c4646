"""Where the embedded scenarios (the toy labs shipped with the package) live.

Each scenario is a directory `otb_diag/lab/<name>/` with `checkpoints/checkpoint-<step>/`,
`rollouts.jsonl` and `lab.json`, written by `otb-diag lab build --scenario <name>`:

- `default`: copy / reverse / sort of 3-40 digits; short responses (median 6 tokens), 16
  prompts x 32 responses, plus tool-use rollouts (`rollouts_tir.jsonl`);
- `long`: running sums of 3-52 digits with a written scratchpad; responses of 20 to 400
  tokens, 16 prompts x 128 responses.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from otb_diag.errors import InputError
from otb_diag.knobs import knob, one_of

LAB_DIR = Path(__file__).resolve().parent.parent / "lab"
SCENARIOS = ("default", "long")
DEFAULT_DIR = LAB_DIR / "default"
DEFAULT_ROLLOUTS = DEFAULT_DIR / "rollouts.jsonl"
DEFAULT_TIR_ROLLOUTS = DEFAULT_DIR / "rollouts_tir.jsonl"


def scenario_knob() -> Any:
    """The `--scenario` field, declared once for every command that takes one."""
    return knob(
        SCENARIOS[0],
        one_of(SCENARIOS),
        help="Embedded scenario, which also supplies an omitted --ckpt / --rollouts: default "
        "(copy, reverse, sort digits; responses of 4-45 tokens) or long (running sums with a "
        "written scratchpad; responses of 20-400 tokens, 16 prompts x 128).",
    )


def check_scenario(scenario: str) -> str:
    """`scenario` itself if it names a scenario, else an `InputError` listing them."""
    if scenario not in SCENARIOS:
        raise InputError(
            f"unknown scenario '{scenario}'; choose one of {', '.join(SCENARIOS)}",
            field="scenario",
        )
    return scenario


def _scenario_dir(scenario: str = "default") -> Path:
    """The shipped directory of `scenario`; an unknown or missing one is an `InputError`."""
    path = LAB_DIR / check_scenario(scenario)
    if not (path / "rollouts.jsonl").is_file():
        raise InputError(
            f"the '{scenario}' scenario is not shipped in this installation ({path}); build it "
            f"with `otb-diag lab build --scenario {scenario} --out DIR` and pass --ckpt and "
            "--rollouts from DIR",
            field="scenario",
        )
    return path


def default_rollouts(scenario: str = "default") -> Path:
    """The rollouts file of `scenario`, sampled from its final checkpoint."""
    return _scenario_dir(scenario) / "rollouts.jsonl"


def default_checkpoints(scenario: str = "default") -> list[Path]:
    """All shipped checkpoints of `scenario`'s training run, oldest first (`checkpoint-<step>`)."""
    root = _scenario_dir(scenario) / "checkpoints"
    dirs = [p for p in root.glob("checkpoint-*") if p.is_dir()]
    return sorted(dirs, key=lambda p: int(p.name.split("-")[-1]))


def default_checkpoint(scenario: str = "default") -> Path:
    """The final shipped checkpoint of `scenario`: the one its rollouts were sampled from."""
    ckpts = default_checkpoints(scenario)
    if not ckpts:
        raise FileNotFoundError(f"no embedded checkpoint under {_scenario_dir(scenario)}")
    return ckpts[-1]
