"""Knobs declared once: every option of every command is built from a settings field, so the
command line's default is the dataclass's, every field has a flag and a help, no flag appears
twice in a command, and help that lists a registry's names shows one registered later."""

from __future__ import annotations

import dataclasses
import math
import re
import typing
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
