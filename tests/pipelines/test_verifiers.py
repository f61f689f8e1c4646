"""The verifier registry, each verifier on hand-computed cases."""

import sys
from pathlib import Path

import pytest

from otb_diag.errors import InputError
from otb_diag.pipelines.sample.verifiers import (
    VERIFIERS,
    get_verifier,
    last_boxed,
    register_verifier,
)


def score(spec: str, response: str, answer: str | None = None, prompt: str = "q") -> float:
    return get_verifier(spec)(prompt, response, answer)


def test_exact_and_contains() -> None:
    assert score("exact", " 42\n", "42") == 1.0
    assert score("exact", "42.", "42") == 0.0
    assert score("contains", "so the answer is Paris.", "Paris") == 1.0
    assert score("contains", "paris", "Paris") == 0.0


def test_last_number_with_a_tolerance() -> None:
    assert score("last-number", "3 apples and 1,234.5 pears", "1234.5") == 1.0
    assert score("last-number", "first 7 then -3", "-3") == 1.0
    assert score("last-number", "no number here", "3") == 0.0
    assert score("last-number", "about 100.4", "100") == 0.0  # default 1e-6 relative
    assert score("last-number:0.005", "about 100.4", "100") == 1.0  # 0.4 ≤ 0.005·100
    assert score("last-number:0.005", "about 100.6", "100") == 0.0
    assert score("last-number:0.01", "0.005", "0") == 1.0  # absolute below 1
    with pytest.raises(ValueError, match="not a number"):
        score("last-number", "3", "three")
    with pytest.raises(InputError, match="tolerance"):
        get_verifier("last-number:abc")


def test_boxed_takes_the_last_balanced_box() -> None:
    assert last_boxed(r"\boxed{1} then \boxed{\frac{1}{2}} end") == r"\frac{1}{2}"
    assert last_boxed(r"\boxed{unclosed") is None
    assert score("boxed", r"so \boxed{\frac{1}{2}}", r"\frac{1}{2}") == 1.0
    assert score("boxed", r"\boxed{2.0}", "2") == 1.0  # as numbers
    assert score("boxed", r"\boxed{3}", r"\boxed{3}") == 1.0
    assert score("boxed", "3", "3") == 0.0  # no box, no reward


def test_regex_with_and_without_a_group() -> None:
    assert score("regex:^yes", "yes indeed") == 1.0
    assert score("regex:^yes", "oh yes") == 0.0
    assert score(r"regex:answer: (\d+)", "answer: 12", "12") == 1.0
    assert score(r"regex:answer: (\d+)", "answer: 13", "12") == 0.0
    assert score("regex:a:b", "xa:by") == 1.0  # the pattern may hold colons
    with pytest.raises(InputError, match="does not compile"):
        get_verifier("regex:(")
    with pytest.raises(InputError, match="needs an argument"):
        get_verifier("regex")


def test_math_verify_compares_mathematically() -> None:
    pytest.importorskip("math_verify")
    assert score("math", r"The answer is $\frac{1}{2}$", "0.5") == 1.0
    assert score("math", r"The answer is $\frac{1}{3}$", "0.5") == 0.0


def test_math_without_the_package_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "math_verify", None)  # import fails
    with pytest.raises(InputError, match=r"otb-diag\[math\]"):
        score("math", "1", "1")


def test_user_functions_from_a_file_and_a_module(tmp_path: Path, monkeypatch) -> None:
    (tmp_path / "myreward.py").write_text(
        "def fn(prompt, response, answer):\n    return len(response) + (answer == 'a')\n"
    )
    assert score(f"{tmp_path / 'myreward.py'}:fn", "abc", "a") == 4.0
    monkeypatch.syspath_prepend(str(tmp_path))
    assert score("myreward:fn", "ab", None) == 2.0
    with pytest.raises(InputError, match="no function 'nope'"):
        get_verifier("myreward:nope")
    with pytest.raises(InputError, match="does not exist"):
        get_verifier(f"{tmp_path / 'missing.py'}:fn")


def test_unknown_names_list_the_registry_and_registering_is_one_decorator() -> None:
    with pytest.raises(InputError, match="exact, contains, last-number, boxed, regex, math"):
        get_verifier("nope")
    try:

        @register_verifier("always-one", needs_answer=False)
        def always_one(prompt, response, answer, arg):
            return 1.0

        assert score("always-one", "x") == 1.0
        assert not get_verifier("always-one").needs_answer
    finally:
        VERIFIERS.pop("always-one", None)
