"""`otb-diag report`: the page parses, holds nothing external, opens with every verdict of the
runs it was given (numbers read back from the runs' own files), says what is absent, and
renders in a real headless Chromium."""

import base64
import html
import json
import math
import re
import shlex
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from matplotlib import image
from small_runs import invoke, run_variance
from small_runs import report as report_of
from test_dynamics import synthetic_run
from unwritten_figures import unwritten_figures

from otb_diag.errors import InputError
from otb_diag.pipelines.regress.run_metrics import collect_metrics

GOLDEN = Path(__file__).resolve().parents[1] / "golden" / "energy_variance.json"


class Page(HTMLParser):
    """Tags, attributes and visible text of a page, by the standard library's parser."""

    def __init__(self, text: str) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self.text_parts: list[str] = []
        self._skip = 0
        self.feed(text)
        self.close()

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))
        self._skip += tag in ("style", "script")

    def handle_endtag(self, tag: str) -> None:
        self._skip -= tag in ("style", "script")

    def handle_data(self, data: str) -> None:
        if not self._skip:
            self.text_parts.append(data)

    @property
    def text(self) -> str:
        return " ".join(" ".join(self.text_parts).split())


def dynamics_run(tmp: Path) -> Path:
    """`otb-diag dynamics` on a log in our metrics.jsonl format with a planted collapse at step
    300 and a variance rise at step 260 (test_dynamics.synthetic_run)."""
    log = synthetic_run().rename(
        columns={"score": "mean_reward", "variance_proxy": "proxy2_total_power"}
    )
    log = log.drop(columns=["variance_proxy_kind", "baseline", "group_size"])
    path = tmp / "metrics.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in log.to_dict("records")))
    out = tmp / "dynamics"
    code, output = invoke("dynamics", "--log", path, "--label", "otb N=4", "--out", out)
    assert code == 0, output
    return out


@pytest.fixture(scope="module")
def dynamics_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    with unwritten_figures(rendered=("png",)):  # the PNGs the report embeds
        return dynamics_run(tmp_path_factory.mktemp("dynamics"))


@pytest.fixture(scope="module")
def all_runs(tmp_path_factory: pytest.TempPathFactory, runs: Path, dynamics_dir: Path) -> Path:
    """energy + variance (proxy, full) of the shared reduced runs, a dynamics run, a 2-step
    training run and a regress JUnit file, in one directory (PNGs rendered, PDFs drawn)."""
    root = tmp_path_factory.mktemp("all")
    for name in ("energy", "variance"):
        shutil.copytree(runs / name, root / name)
    shutil.copytree(dynamics_dir, root / "dynamics")
    with unwritten_figures(rendered=("png",)):
        code, output = invoke(
            "train", "--updates", "2", "--prompts-per-step", "2", "--group-size", "2",
            "--save-every", "0", "--out", root / "train", "--quiet",
        )  # fmt: skip
        assert code == 0, output
        code, output = invoke(
            "regress", "--golden", GOLDEN, "--current", runs, "--junit", root / "regress.xml"
        )
    assert code == 0, output
    return root


@pytest.fixture(scope="module")
def report(all_runs: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("report") / "report.html"
    assert report_of([all_runs], out, GOLDEN).out == str(out.resolve())
    return out


def test_page_is_self_contained(report: Path) -> None:
    text = report.read_text(encoding="utf-8")
    page = Page(text)
    names = [tag for tag, _ in page.tags]
    assert "script" not in names and "link" not in names and "iframe" not in names
    images = [attrs for tag, attrs in page.tags if tag == "img"]
    assert len(images) >= 10  # energy 3, variance 5, dynamics 3
    for attrs in images:
        src = attrs["src"] or ""
        assert src.startswith("data:image/png;base64,"), src[:60]
        assert base64.b64decode(src.split(",", 1)[1])[:8] == b"\x89PNG\r\n\x1a\n"
    for _, attrs in page.tags:
        for key in ("src", "href", "srcset", "poster", "action", "data"):
            value = attrs.get(key)
            assert value is None or value.startswith("data:"), (key, value)
    assert "@import" not in text and "url(" not in text


def test_sections_come_in_order_and_verdicts_are_read_from_the_runs(
    report: Path, all_runs: Path
) -> None:
    page = report.read_text(encoding="utf-8")
    order = [page.index(f"<h2>{h}</h2>") for h in ("Verdicts", "Figures", "Tables", "Provenance")]
    assert order == sorted(order)
    verdicts = Page(page[: order[1]]).text

    # The budget recommendation leads the verdicts.
    advice = json.loads((all_runs / "variance" / "summary.json").read_text())["noise_scale"]
    first = verdicts.index("prompts and responses per step")
    assert first < verdicts.index("OTB vs mean") and advice["text"] in verdicts
    summary = json.loads((all_runs / "variance" / "summary.json").read_text())
    metrics = collect_metrics(all_runs / "variance")
    for mode in ("proxy", "full"):
        row = next(h for h in summary["headline"] if h["mode"] == mode and h["group_size"] == 4)
        lo, hi = metrics[f"{mode}/token-sum/otb/N4/ratio_to_mean"].interval()
        # summary.json's interval is regress's: one computation (pipelines/variance/evidence.py)
        assert (row["otb_ratio_to_mean_low"], row["otb_ratio_to_mean_high"]) == (lo, hi)
        assert (
            f"({mode} mode, token-sum), OTB at N = 4 has {row['otb_ratio_to_mean']:.3f}× the "
            f"gradient variance of the mean baseline (95 % interval {lo:.3f}–{hi:.3f}; OTB below "
            f"mean: {row['otb_below_mean']})"
        ) in verdicts
        saving = f"at least {row['token_savings']:.0%} fewer sampled tokens at equal variance"
        saving = saving.replace("%", " %")
        assert saving in verdicts if math.isinf(metrics[
            f"{mode}/token-sum/otb/N4/equivalent_mean_group_size"
        ].value) else f"{row['token_savings']:.0%}".replace("%", " %") in verdicts  # fmt: skip
    for claim in summary["paper_claim"]:
        assert f"In {claim['mode']} mode, {claim['text']}." in verdicts
        assert f"at equal variance: {claim['verdict']}" in claim["text"]

    fidelity = pd.read_csv(all_runs / "variance" / "fidelity.csv").iloc[0]
    assert (
        f"with Spearman {fidelity['token_spearman']:.3f} and Pearson "
        f"{fidelity['token_pearson']:.3f} over {int(fidelity['tokens']):,} tokens"
    ) in verdicts

    assert "collapse at step 300" in verdicts and "a lead time of 40 steps" in verdicts
    energy = json.loads((all_runs / "energy" / "summary.json").read_text())["energy"]
    assert f"has mean {energy['sequence_energy_mean']:.3g}" in verdicts
    assert "Training with the otb baseline at N = 2" in verdicts
    golden = json.loads(GOLDEN.read_text())["metrics"]
    assert f"Against the golden file {GOLDEN}: PASS: every metric agrees ({len(golden)} " in (
        verdicts
    )
    assert f"regress report {all_runs / 'regress.xml'}: PASS" in verdicts
    assert "Absent" not in verdicts


@pytest.mark.slow  # runs a command end to end (a real run: seconds)
def test_provenance_command_reproduces_the_energy_run(report: Path, all_runs: Path) -> None:
    """The page's energy command, rerun into another directory, writes the same numbers."""
    page = report.read_text(encoding="utf-8")
    summary = json.loads((all_runs / "energy" / "summary.json").read_text())
    assert summary["inputs"]["rollouts"]["sha256"] in page
    commands = [html.unescape(c) for c in re.findall(r"<pre><code>(.*?)</code></pre>", page, re.S)]
    words = shlex.split(next(c for c in commands if c.startswith("otb-diag energy ")))[1:]
    out = all_runs.parent / "rerun"
    words[words.index("--out") + 1] = str(out)
    code, output = invoke(*words, "--quiet")
    assert code == 0, output
    a = pd.read_csv(all_runs / "energy" / "sequences.csv")
    b = pd.read_csv(out / "sequences.csv")
    pd.testing.assert_frame_equal(a, b)


def report_text(tmp_path: Path, *dirs: Path) -> str:
    out = tmp_path / "r.html"
    report_of(list(dirs), out)
    return Page(out.read_text(encoding="utf-8")).text


def test_energy_only(runs: Path, tmp_path: Path) -> None:
    text = report_text(tmp_path, runs / "energy")
    assert "no variance-compare run: no OTB mean-equivalent N′" in text
    assert "no dynamics run: no collapse" in text and "no regression status" in text
    assert "OTB vs mean" not in text and "proxy fidelity (" not in text
    assert "energy (energy)" in text


def test_dynamics_only(dynamics_dir: Path, tmp_path: Path) -> None:
    text = report_text(tmp_path, dynamics_dir)
    assert "collapse at step 300" in text
    assert "no energy run" in text and "no variance-compare run" in text


@pytest.mark.slow  # runs a command end to end (a real run: seconds)
def test_variance_without_full_mode(reduced_rollouts: Path, tmp_path: Path) -> None:
    run_variance(
        reduced_rollouts,
        tmp_path / "v",
        args=["--mode", "proxy", "--group-sizes", "2,4", "--draws", "40", "--sketch-dim", "32"],
    )
    text = report_text(tmp_path, tmp_path / "v")
    assert "v: no full mode" in text and "no head or full mode, so no proxy fidelity" in text
    assert "OTB vs mean, proxy (v)" in text and "OTB vs mean, full" not in text
    assert "proxy fidelity (v)" not in text


def test_nothing_recognisable_is_bad_input(tmp_path: Path) -> None:
    (tmp_path / "summary.json").write_text('{"command": "something-else"}')
    (tmp_path / "notes.xml").write_text("<notes/>")
    with pytest.raises(InputError):
        report_of([tmp_path], tmp_path / "r.html")
    assert not (tmp_path / "r.html").exists()
    with pytest.raises(InputError, match="no such file or directory"):
        report_of([tmp_path / "missing"], tmp_path / "r.html")


def test_golden_without_energy_or_variance_run_is_bad_input(
    dynamics_dir: Path, tmp_path: Path
) -> None:
    with pytest.raises(InputError):
        report_of([dynamics_dir], tmp_path / "r", GOLDEN)
    assert not (tmp_path / "r").exists()


# ---------------------------------------------------------------- a real browser

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMIUM_FLAGS = [
    *("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run"),
    *("--disable-background-networking", "--disable-component-update", "--disable-sync"),
]


@pytest.mark.skipif(
    CHROMIUM is None, reason="no chromium on PATH (Debian: apt-get install chromium)"
)
@pytest.mark.slow  # runs Chromium
def test_renders_in_headless_chromium(report: Path, tmp_path: Path) -> None:
    def chromium(*args: str) -> subprocess.CompletedProcess:
        profile = tmp_path / f"profile-{len(list(tmp_path.iterdir()))}"
        return subprocess.run(
            [CHROMIUM, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", *args, report.as_uri()],
            capture_output=True,
            text=True,
            timeout=120,
        )

    dom = chromium("--dump-dom")
    assert dom.returncode == 0, dom.stderr[-2000:]
    text = Page(dom.stdout).text
    assert "collapse at step 300" in text and "PASS: every metric agrees" in text
    assert "the paper's > 65 % is at equal score over training, a different quantity" in text

    shot = tmp_path / "shot.png"
    result = chromium(f"--screenshot={shot}", "--window-size=1200,1600")
    assert result.returncode == 0 and shot.is_file(), result.stderr[-2000:]
    pixels = image.imread(shot)[..., :3]
    assert pixels.shape[:2] == (1600, 1200)
    non_white = (pixels < 0.9).any(-1).mean()
    assert pixels.std() > 0.05 and non_white > 0.02, (pixels.std(), non_white)
    assert np.unique(pixels.reshape(-1, 3), axis=0).shape[0] > 50  # text and figure colours


def test_the_live_table_says_why_its_negative_values_are_negative() -> None:
    """The live table's metrics logged below 0 (unbiased ‖G‖² and SNR of a step that resolves no
    signal) are named beside the table with why; a table with none below 0 has no such note."""
    from otb_diag.dynamics.detection_rule import DetectionRule
    from otb_diag.pipelines.report.sections import Run, _live_table
    from otb_diag.pipelines.results.dynamics import DynamicsResult, DynamicsRun

    def live(name: str, otb: dict[str, float]) -> DynamicsRun:
        return DynamicsRun(
            *(name, f"/{name}.jsonl", "trl", "grpo", 4, 20, 1, 20, 0.5, None, None, None, None),
            *("proxy2_total_power", None, False, None),
            otb=otb,
            otb_steps=dict.fromkeys(otb, 20),
        )

    runs = [
        live("a", {"otb/split/grpo/grad_sq": -0.037, "otb/split/grpo/snr": -0.113,
                   "otb/split/grpo/within": 0.5}),
        live("b", {"otb/split/grpo/grad_sq": 0.02, "otb/split/grpo/snr": 0.3,
                   "otb/split/grpo/within": 0.4}),
    ]  # fmt: skip

    def table(rows: list[DynamicsRun]) -> str:
        result = DynamicsResult(DetectionRule(), None, rows, "/o")
        return html.unescape(_live_table(Run(Path("d"), "dynamics", result, "d", Path("."))))

    text = table(runs)
    assert "-0.037" in text and "-0.113" in text
    assert (
        "otb/split/grpo/grad_sq, otb/split/grpo/snr: unbiased estimates, a measured spread less "
        "its noise" in text
    )
    assert "within:" not in text and "below 0" in text
    assert "below 0" not in table(runs[1:])


def test_an_unbounded_interval_end_reads_infinite_in_the_verdicts_and_tables(runs: Path) -> None:
    """summary.json holds an infinite end of an interval as null (strict JSON): a variance run
    whose OTB/mean interval is open above (a few bootstrap draws on a small pool) reads it back
    as None, and the report's verdict sentence, its table and variance-compare's own table print
    it ∞ (the verdict raised a TypeError on `make demo`'s smallest path)."""
    from otb_diag.pipelines.report.sections import Run, variance_tables
    from otb_diag.pipelines.report.verdicts import variance_verdicts
    from otb_diag.pipelines.results.read import read_record, result_from_json

    path = runs / "variance" / "summary.json"
    data = read_record(path)
    for row in data["headline"]:
        row["otb_ratio_to_mean_high"] = None
    result = result_from_json(json.loads(json.dumps(data)), path)
    low = result.headline[0].otb_ratio_to_mean_low
    said = " ".join(v.sentence for v in variance_verdicts(result, "v"))
    assert re.search(r"\(95 % interval \d+\.\d{3}–∞; OTB below mean", said), said
    run = Run(path.parent, "variance-compare", result, "v", runs)
    assert f"{result.headline[0].otb_ratio_to_mean:.3f} [{low:.3g}, ∞]" in variance_tables(run)
    assert f"[{low:.3g}, ∞]" in result.format()
