"""`variance-compare --zero-tail-split` on a tiny real checkpoint with head-mode gradients: OTB
with and without verl's zero tail side by side (the row `otb-no-zero-tail` of variance.csv),
zero_tail.csv and the printed line; pools mostly all-correct, as late in training, one
response empty (an aborted generation)."""

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from otb_diag.cli.main import app
from tiny import save_checkpoint
from typer.testing import CliRunner

from otb_diag.errors import InputError
from otb_diag.pipelines.variance.settings import VarianceSettings

runner = CliRunner()


@pytest.fixture(scope="module")
def inputs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("vzt")
    save_checkpoint(root / "checkpoint-3", seed=3)
    rng = np.random.default_rng(4)
    rows = []
    for g in range(4):
        for k in range(8):
            rows.append(
                {
                    "group": g,
                    "prompt_ids": [2 + g, 5],
                    "reward": 1.0 if g else float(k % 2),  # three all-correct pools, one mixed
                    "response_ids": rng.integers(2, 28, size=int(rng.integers(2, 10))).tolist(),
                }
            )
    rows[0]["response_ids"] = []  # an aborted generation, drawn like any other member
    path = root / "pool.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return root / "checkpoint-3", path


@pytest.mark.slow  # runs a command end to end (a real run: seconds)
def test_otb_with_and_without_the_zero_tail_side_by_side(inputs, tmp_path: Path) -> None:
    ckpt, rollouts = inputs
    out = tmp_path / "vc"
    args = ["variance-compare", "--ckpt", str(ckpt), "--rollouts", str(rollouts)]
    args += ["--out", str(out), "--mode", "head", "--draws", "30", "--bootstrap", "50"]
    args += ["--sketch-dim", "16", "--group-sizes", "2,4", "--zero-tail-split"]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    variance = pd.read_csv(out / "variance.csv")
    first = variance[variance["aggregation"] == variance["aggregation"].iloc[0]]
    by = first.set_index(["baseline", "group_size"])["variance"]
    tail = pd.read_csv(out / "zero_tail.csv")
    assert tail["group_size"].tolist() == [2, 4] and (tail["mode"] == "head").all()
    for row in tail.itertuples():
        assert row.otb_variance == pytest.approx(by["otb", row.group_size], rel=1e-9)
        assert row.no_zero_tail_variance == pytest.approx(
            by["otb-no-zero-tail", row.group_size], rel=1e-9
        )
        assert row.tail_mean_square_low <= row.tail_mean_square_high
        assert row.mean_zero == (row.tail_mean_square_low <= 0)
    summary = json.loads((out / "summary.json").read_text())
    assert [r["group_size"] for r in summary["zero_tail"]] == [2, 4]
    assert "zero tail (head, step 3, N=4): OTB variance" in result.output
    assert "zero_tail.csv" in summary["outputs"]


def test_the_split_needs_otb_and_the_tail() -> None:
    with pytest.raises(InputError, match="needs otb among the baselines"):
        VarianceSettings(baselines=("none", "mean"), zero_tail_split=True).check()
    with pytest.raises(InputError, match="zero tail on"):
        VarianceSettings(handle_zero_tail=False, zero_tail_split=True).check()
