"""`otb-diag lab build`: the lab of an embedded scenario, rebuilt from a seed in the recipe
shell (`lab/build.py:build_lab` does the work)."""

from __future__ import annotations

from pathlib import Path

from otb_diag.io.scenarios import check_scenario
from otb_diag.lab.build import SCENARIOS, build_lab
from otb_diag.lab.summary import BuiltLab
from otb_diag.pipelines.inputs import LabInputs
from otb_diag.pipelines.lab_settings import LabSettings
from otb_diag.pipelines.shell import Stage, run_recipe


def run_lab_build(
    inputs: LabInputs, out: Path, settings: LabSettings = LabSettings(), *, progress: bool = True
) -> BuiltLab | None:
    """Build the lab of `inputs.scenario` (an unknown name is an `InputError` listing them,
    before anything is written) into `out`: its checkpoints, rollouts and lab.json, all moved
    into `out` together once built (a previous lab's `checkpoints/` replaced whole). Returns
    the built lab (None on the ranks other than 0 under torchrun, which wait)."""
    config = SCENARIOS[check_scenario(inputs.scenario)]

    def body(stage: Stage) -> BuiltLab:
        assert stage.into is not None  # the shell stages a folder: `out` is given
        manifest = build_lab(stage.into, seed=settings.seed, config=config, progress=progress)
        return BuiltLab(manifest, out)

    # build_lab writes lab.json itself: it is the library's record of a lab, the shell adds none
    return run_recipe(body, out=out, record=None, progress=progress, every_rank=False)
