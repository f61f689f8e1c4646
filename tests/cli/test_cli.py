"""The command line as a user meets it: help, the embedded default, bad input."""

import json
from pathlib import Path

import pytest
from otb_diag.cli.main import app
from typer.testing import CliRunner

runner = CliRunner()


def write(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.mark.parametrize(
    "args",
    [
        [],
        ["rollouts"],
        ["rollouts", "inspect"],
        ["rollouts", "sample"],
        ["lab"],
        ["lab", "build"],
        ["energy"],
        ["variance-compare"],
        ["train"],
        ["dynamics"],
        ["figures"],
        ["regress"],
        ["report"],
    ],
)
def test_help_teaches_with_an_example(args: list[str]) -> None:
    result = runner.invoke(app, [*args, "--help"])
    assert result.exit_code == 0
    assert "Example" in result.output


def test_inspect_json_on_a_file_with_ids(tmp_path: Path) -> None:
    rows = [
        {"uid": "p", "prompt_ids": [1], "response_ids": [2, 3], "reward": 1.0},
        {"uid": "p", "prompt_ids": [1], "response_ids": [2, 3, 4, 5], "reward": 0.0},
        {"uid": "q", "prompt_ids": [1], "response_ids": [2], "reward": 0.0, "mask": [0]},
    ]
    result = runner.invoke(
        app, ["rollouts", "inspect", str(write(tmp_path / "r.jsonl", rows)), "--json"]
    )
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert summary["rows"] == 3
    assert summary["groups"] == 2
    assert summary["singleton_groups"] == ["q"]
    assert summary["response_tokens"]["max"] == 4
    assert summary["masked_tokens"]["count"] == 1


def test_inspect_bad_input_exits_2_naming_file_line_field(tmp_path: Path) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text('{"group": 1, "prompt_ids": [1], "response_ids": [2], "reward": 1}\n{"group"\n')
    result = runner.invoke(app, ["rollouts", "inspect", str(path)])
    assert result.exit_code == 2
    assert str(path) in result.stderr
    assert "line 2" in result.stderr
    assert "Traceback" not in result.stderr


ROWS = [
    {"uid": "p", "prompt_ids": [1], "response_ids": [2, 3], "reward": 1.0},
    {"uid": "p", "prompt_ids": [1], "response_ids": [2], "reward": 0.0},
]


def test_inspect_takes_rollouts_positionally_or_as_the_option(tmp_path: Path) -> None:
    path = str(write(tmp_path / "r.jsonl", ROWS))
    positional = runner.invoke(app, ["rollouts", "inspect", path, "--json"])
    option = runner.invoke(app, ["rollouts", "inspect", "--rollouts", path, "--json"])
    both = runner.invoke(app, ["rollouts", "inspect", path, "--rollouts", path, "--json"])
    assert positional.exit_code == option.exit_code == both.exit_code == 0, option.output
    assert json.loads(positional.stdout) == json.loads(option.stdout) == json.loads(both.stdout)
    assert json.loads(option.stdout)["rows"] == 2


def test_inspect_refuses_two_different_rollouts_and_two_ckpt(tmp_path: Path) -> None:
    a = str(write(tmp_path / "a.jsonl", ROWS))
    b = str(write(tmp_path / "b.jsonl", ROWS))
    result = runner.invoke(app, ["rollouts", "inspect", a, "--rollouts", b])
    assert result.exit_code == 2
    assert "rollouts given twice" in result.stderr and b in result.stderr
    result = runner.invoke(app, ["rollouts", "inspect", a, "--ckpt", "x", "--ckpt", "y"])
    assert result.exit_code == 2
    assert "2 --ckpt given" in result.stderr and "one tokenizer" in result.stderr
    assert "Traceback" not in result.stderr


# Options whose help says what this command does with them (same meaning, other wording).
WORDED_PER_COMMAND = {
    "--baselines",
    "--batch-tokens",  # energy, variance-compare: auto from free memory; sample: a fixed size
    "--golden",
    "--max-new-tokens",
    "--out",
    "--prompts-per-step",  # a training step's prompts: train sets them, variance-compare its SNR
    "--seed",
    "--temperature",
}


def test_an_option_name_is_declared_one_way_in_every_command() -> None:
    """--ckpt, --rollouts, --steps, --json, --device, --scenario ... are each declared once:
    the same help, the same repeatability and type wherever they appear."""
    import typer.main

    declared: dict[str, set[tuple]] = {}

    def walk(command, path: str) -> None:
        if hasattr(command, "commands"):
            for name, sub in command.commands.items():
                walk(sub, f"{path} {name}")
            return
        for param in command.params:
            if type(param).__name__.endswith("Option"):
                for opt in param.opts:
                    declared.setdefault(opt, set()).add(
                        (param.help, param.multiple, str(param.display_type))
                    )

    walk(typer.main.get_command(app), "otb-diag")
    assert {"--ckpt", "--rollouts", "--steps", "--json", "--scenario"} <= set(declared)
    differing = {opt for opt, ways in declared.items() if len(ways) > 1}
    assert differing <= WORDED_PER_COMMAND, differing - WORDED_PER_COMMAND
    assert all(multiple for _, multiple, _ in declared["--ckpt"])


def test_the_command_line_starts_without_torch() -> None:
    """Parsing a command line, `--help` included, imports none of the heavy stack: every
    subprocess the tool or its tests start (torchrun ranks, bench scripts) pays for what the
    CLI imports at start-up. A command imports its library code when it runs."""
    import subprocess
    import sys

    code = (
        "import sys, otb_diag.cli.main; "
        "print(*(m in sys.modules for m in ('torch', 'transformers', 'matplotlib', 'pandas')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False"] * 4


def test_show_prints_nothing_for_a_rank_that_holds_no_result(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Under torchrun every entry point returns None on the ranks other than 0 (rank 0 prints):
    `show` prints nothing for it, in text and in --json, for every command alike (dynamics and
    figures once passed it on and failed on rank 1)."""
    from otb_diag.cli.common import show

    show(None, as_json=True)
    show(None, as_json=False, out="x")
    assert capsys.readouterr().out == ""


def test_an_error_inside_a_progress_bar_is_printed_on_its_own_line(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A command stopped by bad input while its bar is drawn: the bar is closed (its line
    ended) before the error, which starts its own line; a note said meanwhile goes above the
    bar, never into its line."""
    import typer
    from otb_diag.cli.common import friendly_errors, note
    from tqdm.auto import tqdm

    from otb_diag.errors import InputError

    @friendly_errors
    def stops_halfway() -> None:
        bar = tqdm(total=10, desc="variance")
        bar.update(3)
        note("--device auto: using cpu")
        raise InputError("--draws: must be at least 2, got 0")

    with pytest.raises(typer.Exit) as stopped:
        stops_halfway()
    assert stopped.value.exit_code == 2
    lines = [part for line in capsys.readouterr().err.split("\n") for part in line.split("\r")]
    said = [line for line in lines if "otb-diag: error:" in line or "--device auto" in line]
    assert said == [
        "--device auto: using cpu",
        "otb-diag: error: --draws: must be at least 2, got 0",
    ]
    assert not tqdm._instances  # the bar was closed


def test_a_hint_follows_its_message_as_a_sentence() -> None:
    from otb_diag.errors import InputError

    err = InputError("this prompt has none", field="answer", hint="Name the column.")
    assert str(err) == "field 'answer': this prompt has none. Name the column."
    assert str(InputError("holds a partial run (.sample-parts/)", hint="Pass --resume.")) == (
        "holds a partial run (.sample-parts/). Pass --resume."
    )
    assert str(InputError("ends here.", hint="Next.")) == "ends here. Next."


def test_ctrl_c_on_rollouts_sample_says_how_to_resume(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ctrl-C while sampling (after two batches were written): one paragraph, what was kept and
    the command that finishes it, exit 130 (128 + SIGINT, the shells' convention)."""
    from otb_diag.pipelines.sample import recipe

    out = tmp_path / "pools"

    def interrupted(*args: object, **kwargs: object) -> None:
        (out / recipe.PARTS).mkdir(parents=True)
        for k in range(2):
            (out / recipe.PARTS / f"part-{k:06d}.jsonl").write_text("")
        raise KeyboardInterrupt

    monkeypatch.setattr(recipe, "run_recipe", interrupted)
    prompts = write(tmp_path / "p.jsonl", [{"prompt": "C:1=", "answer": "1"}])
    args = ["rollouts", "sample", "--prompts", str(prompts), "--out", str(out)]
    result = runner.invoke(app, args)
    assert result.exit_code == 130
    assert result.stderr.splitlines()[-1] == (
        f"otb-diag: interrupted (Ctrl-C). 2 finished batches of responses kept in "
        f"{out / recipe.PARTS}/: run the same command with --resume to sample only the rest "
        "(the pools are exactly those of an uninterrupted run)."
    )
