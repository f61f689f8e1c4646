"""The public Python API: the README's "Python API" example runs as written, and `import
otb_diag` exposes exactly its names without importing torch."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

import otb_diag

README = Path(__file__).resolve().parent.parent / "README.md"


def readme_example() -> str:
    section = README.read_text(encoding="utf-8").split("## Python API", 1)[1]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


@pytest.mark.slow  # runs a command end to end (a real run: seconds)
def test_readme_example_runs_and_prints_what_it_says(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    namespace: dict = {}
    exec(compile(readme_example(), "README.md#python-api", "exec"), namespace)
    printed = capsys.readouterr().out.splitlines()
    # The verdict and the collapse step are printed as the comments say.
    assert printed[-2] in {"holds", "does not hold", "not resolved", "no signal"}
    assert printed[-1] == "150"
    # The objects are what the names promise, on the embedded default.
    batch, stats, adv, tables = (namespace[k] for k in ("batch", "stats", "adv", "tables"))
    assert adv.shape == batch.mask.shape == stats.w.shape
    assert (adv[batch.mask == 0] == 0).all()
    assert len(tables.sequences) == len(batch.length) == 512
    assert (tmp_path / "out" / "api-variance" / "variance.csv").is_file()


def test_advantages_follow_the_registry(monkeypatch: pytest.MonkeyPatch) -> None:
    """A baseline registered once is usable by name; `mean` gives R − mean_j R_j on a hand case."""
    import torch

    from otb_diag.maths.energy.token_stats import TokenStats
    from otb_diag.maths.estimators import registry

    # setitem records the name as absent, so teardown unregisters what the decorator adds.
    monkeypatch.setitem(registry.BASELINES, "half-reward", None)
    del registry.BASELINES["half-reward"]

    @otb_diag.register_baseline("half-reward")
    def half(returns, mask, group, energy):  # noqa: ARG001
        return returns / 2 * mask

    assert "half-reward" in otb_diag.baseline_names()
    _, rollouts_path = otb_diag.embedded_default()
    batch = otb_diag.response_batch(otb_diag.read_rollouts(rollouts_path))
    w = torch.ones_like(batch.mask)
    stats = TokenStats(w, w, w, w, w, None)  # neither baseline reads the energy
    halves = otb_diag.advantages(batch, stats, "half-reward")
    mean = otb_diag.advantages(batch, stats, "mean")
    last = (batch.length - 1)[:, None]  # the outcome reward's token; G_t = R on every token
    g0 = batch.group == 0
    rewards = batch.reward[g0]
    torch.testing.assert_close(mean[g0].gather(1, last[g0]).squeeze(1), rewards - rewards.mean())
    torch.testing.assert_close(halves.gather(1, last).squeeze(1), batch.reward / 2)


def test_import_is_cheap_and_exposes_the_documented_names() -> None:
    code = "import sys, otb_diag; print('torch' in sys.modules, 'transformers' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"]
    for name in otb_diag.__all__:
        assert getattr(otb_diag, name) is not None
    with pytest.raises(AttributeError):
        otb_diag.token_stats  # noqa: B018  (internal modules are not part of the API)
