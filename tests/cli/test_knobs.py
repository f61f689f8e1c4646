"""Knobs declared once: every option of every command is built from a settings field, so the
command line's default is the dataclass's, every field has a flag and a help, no flag appears
twice in a command, and help that lists a registry's names shows one registered later."""

from __future__ import annotations

import dataclasses
import math
import re
import typing
from pathlib import Path
from types import SimpleNamespace

import pytest
import typer.main
from hypothesis import given
from hypothesis import strategies as st
from otb_diag.cli.main import app
from otb_diag.cli.options import Command, instance
from typer.testing import CliRunner

from otb_diag.errors import InputError
from otb_diag.knobs import KEY, comma_ints, comma_list, joined
from otb_diag.pipelines.variance.settings import duration, seconds

runner = CliRunner()


def commands(typer_app: typer.Typer = app, path: str = "") -> list[tuple[str, Command]]:
    """(command line, `Command`) of every command of the app, sub-apps included."""
    found = [
        (f"{path} {info.name}".strip(), info.callback) for info in typer_app.registered_commands
    ]
    for group in typer_app.registered_groups:
        found += commands(group.typer_instance, f"{path} {group.name}".strip())
    return found


COMMANDS = commands()


def help_text(*args: str) -> str:
    """The help of a command, unwrapped (Click wraps at whitespace and after hyphens)."""
    result = runner.invoke(app, [*args, "--help"])
    assert result.exit_code == 0, result.output
    return " ".join(re.sub(r"-\n\s*", "-", result.output).split())


IDS = [name for name, _ in COMMANDS]


def test_every_command_is_built_from_knobs() -> None:
    assert {name for name, _ in COMMANDS} == {
        "energy",
        "variance-compare",
        "figures",
        "regress",
        "dynamics",
        "train",
        "report",
        "rollouts inspect",
        "rollouts sample",
        "lab build",
    }
    assert all(isinstance(cmd, Command) for _, cmd in COMMANDS)


def fields_of(cls: type) -> list[tuple[str, dataclasses.Field]]:
    """Every field of `cls`, those of nested settings dataclasses (not knobs) flattened."""
    hints = typing.get_type_hints(cls)
    found = []
    for field in dataclasses.fields(cls):
        if KEY not in field.metadata and dataclasses.is_dataclass(hints[field.name]):
            found += fields_of(hints[field.name])
        else:
            found.append((field.name, field))
    return found


@pytest.mark.parametrize(("name", "cmd"), COMMANDS, ids=IDS)
def test_every_field_is_a_knob_or_internal(name: str, cmd: Command) -> None:
    """A field without a knob (nor `internal`) would be a setting the command line cannot
    reach without anyone deciding so."""
    for _, cls in cmd.parts:
        for field_name, field in fields_of(cls):
            assert KEY in field.metadata, f"{cls.__name__}.{field_name}"


@pytest.mark.parametrize(("name", "cmd"), COMMANDS, ids=IDS)
def test_every_option_has_a_flag_and_help_and_no_flag_twice(name: str, cmd: Command) -> None:
    click_command = typer.main.get_command(app)
    for word in name.split():
        click_command = click_command.commands[word]
    flags = [opt for param in click_command.params for opt in param.opts]
    assert len(flags) == len(set(flags)), name
    options = cmd.options()
    assert len(options) == len(click_command.params)
    for option in options:
        assert option.knob.help_text().strip(), f"{name}: {option.path} has no help"
        assert option.knob.argument or option.flag.startswith("--"), option.path


@pytest.mark.parametrize(("name", "cmd"), COMMANDS, ids=IDS)
def test_the_command_line_default_is_the_dataclass_default(name: str, cmd: Command) -> None:
    """Each option's default, read back from the built Click command, becomes the field's own
    default (a registry's default is kept by the option's None); and a settings object built
    from the defaults of the command line equals the dataclass's default object."""
    click_command = typer.main.get_command(app)
    for word in name.split():
        click_command = click_command.commands[word]
    params = {param.name: param for param in click_command.params}
    for option in cmd.options():
        default = params[option.name].default
        if option.lazy_default:
            assert default is None, option.path
            shown = option.shown_default()
            parse = option.knob.parse or (lambda v: v)
            assert parse(shown) == option.field.default_factory(), option.path
            continue
        if option.field.default is dataclasses.MISSING:
            assert params[option.name].required, option.path
            continue
        parsed = (
            option.knob.parse(default) if option.knob.parse and default is not None else default
        )
        expected = option.field.default
        if isinstance(expected, tuple) and isinstance(parsed, list):
            parsed = tuple(parsed)
        assert parsed == expected, option.path
    values = {o.name: o.cli_default() for o in cmd.options()}
    for _, cls in cmd.parts:
        required = [f for _, f in fields_of(cls) if f.default is f.default_factory]  # both MISSING
        if not required:
            assert instance(cls, "", values, cmd.skip) == cls(), cls.__name__


def test_a_newly_registered_verifier_shows_in_the_help(monkeypatch: pytest.MonkeyPatch) -> None:
    from otb_diag.pipelines.sample import verifiers

    monkeypatch.setattr(verifiers, "VERIFIERS", dict(verifiers.VERIFIERS))
    before = help_text("rollouts", "sample")
    assert "boxed, regex:PATTERN, math (needs otb-diag[math]), or a function" in before
    assert "shout-check" not in before
    verifiers.register_verifier("shout-check", arg="word")(lambda p, r, a, arg: 1.0)
    assert "otb-diag[math]), shout-check[:WORD], or a function" in help_text("rollouts", "sample")


def test_a_newly_registered_baseline_shows_in_the_help(monkeypatch: pytest.MonkeyPatch) -> None:
    from otb_diag.maths.estimators import registry

    monkeypatch.setattr(registry, "BASELINES", dict(registry.BASELINES))
    registry.register_baseline("median-test", default=False)(lambda *args, **kwargs: None)
    assert "Any registry baseline: none, mean," in help_text("train")
    assert "otb, otb-loo, median-test. [default: otb]" in help_text("train")


def test_registry_defaults_show_as_the_default_in_the_help() -> None:
    from otb_diag.maths.estimators.registry import baseline_names
    from otb_diag.maths.variance.paired_draws import DEFAULT_GROUP_SIZES

    text = help_text("variance-compare")
    assert f"[default: {joined(baseline_names(defaults_only=True))}]" in text
    assert f"[default: {joined(DEFAULT_GROUP_SIZES)}]" in text
    assert "[default: 2h]" in text


names = st.text(alphabet="abcdefghijklmnopqrstuvwxyz-", min_size=1, max_size=8).filter(
    lambda s: s.strip("-")
)


@given(st.lists(names, max_size=6))
def test_comma_list_reads_what_joined_writes(values: list[str]) -> None:
    assert comma_list(joined(values)) == tuple(values)


@given(st.lists(st.integers(min_value=-(10**6), max_value=10**6), max_size=6))
def test_comma_ints_reads_what_joined_writes(values: list[int]) -> None:
    assert comma_ints(joined(values)) == tuple(values)


def test_comma_ints_names_the_bad_text() -> None:
    with pytest.raises(InputError, match="group sizes must be integers, got '2,x'"):
        comma_ints("2,x", "group sizes", "group-sizes")


@given(st.integers(min_value=1, max_value=10**6), st.sampled_from(["s", "m", "h"]))
def test_seconds_reads_what_duration_writes(amount: int, unit: str) -> None:
    value = seconds(f"{amount}{unit}")
    assert value == amount * {"s": 1, "m": 60, "h": 3600}[unit]
    assert math.isclose(seconds(duration(value)), value, rel_tol=1e-12)


def test_duration_by_hand() -> None:
    assert (duration(7200.0), duration(1800.0), duration(90.0), duration(1.5)) == (
        "2h",
        "30m",
        "90s",
        "1.5s",
    )
    with pytest.raises(InputError, match="budget must look like 90s"):
        seconds("soon")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["variance-compare", "--group-sizes", "2,x"], "group sizes must be integers, got '2,x'"),
        (["variance-compare", "--budget", "soon"], "budget must look like 90s, 30m or 2h"),
    ],
)
def test_a_value_its_parser_refuses_is_bad_input(args: list[str], message: str) -> None:
    """Parsing happens inside the error handling: one paragraph, exit 2, no traceback."""
    result = runner.invoke(app, args)
    assert result.exit_code == 2
    assert message in result.stderr
    assert "Traceback" not in result.output + result.stderr


def test_the_z_score_history_follows_a_short_window() -> None:
    """`dynamics --window 5` needs min_points ≤ 5: the rule's own default, min(10, window)."""
    from otb_diag.dynamics.detection_rule import DetectionRule

    assert DetectionRule().min_points == 10
    assert DetectionRule(window=5).min_points == 5
    assert DetectionRule(window=40, min_points=12).min_points == 12


@pytest.mark.parametrize("scenario", ["default", "long"])
def test_train_with_no_options_trains_the_scenarios_settings(
    scenario: str, tmp_path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The scenario supplies the prompts and the response budget; every other knob is
    TrainSettings' own default, exactly what `scenario_settings` gives the API."""
    from otb_diag.pipelines import rl_training

    seen = {}

    def fake_train(start, out, settings, progress):
        seen["settings"] = settings
        return SimpleNamespace(format=lambda: "", to_json=dict)  # a result that prints nothing

    monkeypatch.setattr(rl_training, "train", fake_train)
    result = runner.invoke(app, ["train", "--scenario", scenario, "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert seen["settings"] == rl_training.scenario_settings(scenario)


# Every option that takes a value, a value it refuses and the words of the refusal (after
# "otb-diag: error: "); options shared by several commands are refused alike by each. A knob
# added without an entry here (or in FREE) fails `test_every_knob_has_a_bad_value`.
BAD = {
    "--scenario": ("nope", "--scenario: must be one of default, long, got 'nope'"),
    "--baselines": ("none,mean,nope", "unknown baseline 'nope'; known baselines: none, mean"),
    "--temperature": ("0", "--temperature: must be above 0, got 0.0"),
    "--batch-tokens": ("0", "--batch-tokens: must be at least 1, got 0"),
    "--chunk-size": ("0", "--chunk-size: must be at least 1, got 0"),
    "--threads": ("0", "--threads: must be a whole number from 1 up, or auto, got '0'"),
    "--group": (" ", "--group: must name something, got an empty name"),
    "--device": ("tpu", "unknown device 'tpu'. Use auto, cpu, cuda, cuda:N or mps."),
    "--dtype": ("float8", "--dtype: must be one of auto, float32, bfloat16, float16, got 'float8'"),
    "--device-map": ("tpu:0", "unknown device 'tpu:0' in --device-map 'tpu:0'"),
    "--steps": ("5-2", "--steps: the range '5-2' ends before it starts"),
    "--reward-column": (" ", "--reward-column: must name something, got an empty name"),
    "--trainer-baseline": ("nope", "unknown baseline 'nope'"),
    "--mode": ("fulll", "--mode: must be one of proxy, head, full, got 'fulll'"),
    "--aggregations": ("nope", "unknown aggregation 'nope'; known aggregations:"),
    "--group-sizes": ("4,-2", "--group-sizes: must be at least 2, got -2"),
    "--draws": ("0", "--draws: must be at least 2, got 0 (a variance needs two draws)"),
    "--bootstrap": ("0", "--bootstrap: must be at least 1, got 0"),
    "--sketch-dim": ("0", "--sketch-dim: must be at least 1, got 0"),
    "--seed": ("-1", "--seed: must be a whole number from 0 to 2^63 - 1, got -1"),
    "--engine": ("fwd", "--engine: must be one of auto, jvp, vjp, got 'fwd'"),
    "--params": ("(", "--params: is not a regular expression"),
    "--directions-per-block": ("0", "--directions-per-block: must be at least 1, got 0"),
    "--budget": ("0s", "--budget: must be above 0, got 0.0"),
    "--prompts-per-step": ("0", "--prompts-per-step: must be at least 1, got 0"),
    "--current-n": ("0", "--current-n: must be at least 1, got 0"),
    "--jobs": ("0", "--jobs: must be at least 1, got 0"),
    "--label": (" ", "--label: must name something, got an empty name"),
    "--target": ("nan", "--target: must be a finite score, got nan"),
    "--window": ("4", "--window: must be at least 5, got 4"),
    "--threshold": ("-1", "--threshold: must be at least 0, got -1.0"),
    "--persist": ("0", "--persist: must be at least 1, got 0"),
    "--lead-threshold": ("-1", "--lead-threshold: must be at least 0, got -1.0"),
    "--lead-horizon": ("0", "--lead-horizon: must be at least 1, got 0"),
    "--smooth": ("0", "--smooth: must be at least 1, got 0"),
    "--baseline": ("nope", "unknown baseline 'nope'"),
    "--aggregation": ("nope", "unknown aggregation 'nope'"),
    "--group-size": ("0", "--group-size: must be at least 1, got 0"),
    "--updates": ("0", "--updates: must be at least 1, got 0"),
    "--lr": ("0", "--lr: must be above 0, got 0.0"),
    "--max-grad-norm": ("-1", "--max-grad-norm: must be at least 0, got -1.0"),
    "--max-new-tokens": ("0", "--max-new-tokens: must be at least 1, got 0"),
    "--save-every": ("-1", "--save-every: must be at least 0, got -1"),
    "--n": ("0", "--n: must be at least 1, got 0"),
    "--top-k": ("-1", "--top-k: must be at least 0, got -1"),
    "--top-p": ("0", "--top-p: must lie in (0, 1], got 0.0"),
    "--verifier": ("nope", "unknown verifier 'nope'"),
    "--prompt-column": (" ", "--prompt-column: must name something, got an empty name"),
    "--answer-column": (" ", "--answer-column: must name something, got an empty name"),
}
# Options that take any value of their type: paths, which the command reads (or writes) and
# whose errors name the file (tests/io/, tests/pipelines/); flags (True or False) need none.
FREE = {"--ckpt", "--rollouts", "--out", "--golden", "--current", "--junit", "--tolerances",
        "--log", "--prompts", "--file", "--run-dirs"}  # fmt: skip
# What a command needs on its command line besides the option refused (`{d}`: a folder).
REQUIRED = {
    "rollouts sample": ["--prompts", "{d}/prompts.jsonl", "--out", "{d}/out"],
    "lab build": ["--out", "{d}/out"],
    "dynamics": ["--log", "{d}/metrics.jsonl", "--out", "{d}/out"],
    "regress": ["--golden", "{d}/golden.json", "--current", "{d}/out"],
    "report": ["{d}/runs", "--out", "{d}/out"],
    "rollouts inspect": [],
}


def _walk() -> list[tuple[str, str]]:
    """(command, flag) of every knob field refused in BAD, each field once: a field shared by
    several commands (`Inputs.scenario`, `LoadOptions.dtype`) is one declaration, one check."""
    seen, walk = set(), []
    for name, cmd in COMMANDS:
        for option in cmd.options():
            if option.flag in BAD and id(option.field) not in seen:
                seen.add(id(option.field))
                walk.append((name, option.flag))
    return walk


WALK = _walk()


def test_every_knob_has_a_bad_value() -> None:
    """Every option that takes a value is walked below with one it refuses, or takes any value
    of its type (a path); a new knob comes with its refusal."""
    flags = {o.flag for _, cmd in COMMANDS for o in cmd.options() if o.hint is not bool}
    assert flags - FREE == set(BAD), "give the new option a bad value in BAD (or FREE)"
    assert not FREE & set(BAD)


@pytest.mark.parametrize(("name", "flag"), WALK, ids=[f"{n} {f}" for n, f in WALK])
def test_a_bad_value_stops_the_command_before_any_work(
    name: str, flag: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`otb-diag <command> <flag> <bad value>`: exit 2, one `otb-diag: error:` line on its own
    (no progress bar on it), the refusal's words, and no work: the recipe shell never opened
    its session (where every command reads its files and runs its model) and --out is not
    there. Each knob's check runs when its settings are built; a registry's names and the
    device, at the top of the entry point."""
    from otb_diag.pipelines import shell

    def no_work(*args: object, **kwargs: object) -> None:
        raise AssertionError(f"{name} {flag}: work started before the bad value was refused")

    monkeypatch.setattr(shell, "session", no_work)
    value, message = BAD[flag]
    extra = [arg.format(d=tmp_path) for arg in REQUIRED.get(name, ["--out", "{d}/out"])]
    result = runner.invoke(app, [*name.split(), *extra, flag, value])
    errors = [line for line in result.stderr.splitlines() if "otb-diag: error:" in line]
    assert result.exit_code == 2, result.output + result.stderr
    assert len(errors) == 1 and errors[0].startswith("otb-diag: error: "), result.stderr
    assert message in errors[0]
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "out").exists()
