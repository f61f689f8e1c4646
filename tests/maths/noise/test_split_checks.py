"""`maths/noise/split_checks.py`: a logged split's impossible values are refused (a negative
trace of a covariance, P < 1, N < 2, an infinite estimate) while the unbiased estimates that may
be negative pass (|G|², and tr Σ of the two-batch estimate); a split that cannot be pooled is
named with why; the names are read from the keys' ends."""

from __future__ import annotations

import math

import pytest

from otb_diag.maths.noise.budget_stream import split_names
from otb_diag.maths.noise.split_checks import refused, unpooled

STEP = {
    "otb/split/prompts": 8.0,
    "otb/split/group_size": 4.0,
    "otb/split/mean_response_tokens": 20.0,
    "otb/split/grpo/within": 3.0,
    "otb/split/grpo/between": -0.5,  # an unbiased difference: may be negative
    "otb/split/grpo/total": 2.5,
    "otb/split/grpo/grad_sq": -0.2,  # unbiased: negative where the signal is below the noise
    "otb/split/params/total": -4.0,  # two-batch (no within): a difference of two squares
    "otb/split/params/grad_sq": 1.0,
    "otb/energy/sequence_mean": -1.0,  # not the split's: not checked here
}


def test_a_possible_step_passes_and_pools_whole() -> None:
    assert refused(STEP, "otb/") is None
    assert unpooled(STEP, "otb/") == []
    assert unpooled({"otb/energy/sequence_mean": 1.0}, "otb/") == []  # no split at this step


@pytest.mark.parametrize(
    ("key", "value", "rule"),
    [
        ("otb/split/grpo/total", -20.0, "sample variance"),
        ("otb/split/grpo/within", -0.1, "mean of sample variances"),
        ("otb/split/prompts", 0.0, "count of at least 1"),
        ("otb/split/prompts", -3.0, "count of at least 1"),
        ("otb/split/group_size", 1.0, "at least 2"),
        ("otb/split/mean_response_tokens", -1.0, "never negative"),
        ("otb/split/grpo/grad_sq", math.inf, "finite"),
        ("otb/split/params/total", -math.inf, "finite"),
    ],
)
def test_an_impossible_value_is_refused_with_its_key_and_rule(
    key: str, value: float, rule: str
) -> None:
    found = refused(STEP | {key: value}, "otb/")
    assert found is not None and found.key == key and found.value == value
    assert rule in found.rule


def test_a_split_without_its_shape_or_its_terms_says_why() -> None:
    no_shape = {k: v for k, v in STEP.items() if k != "otb/split/group_size"}
    (reason,) = unpooled(no_shape, "otb/")
    assert "without the step's shape (otb/split/group_size absent)" in reason
    one_prompt = STEP | {
        "otb/split/prompts": 1.0,
        "otb/split/grpo/total": math.nan,  # absent, or a value the reader found not a number
        "otb/split/grpo/grad_sq": math.nan,
    }
    assert unpooled(one_prompt, "otb/") == [
        "otb/split/grpo/total and otb/split/grpo/grad_sq absent or not a number "
        "(P = 1: no spread between prompts)"
    ]


def test_names_are_read_from_the_keys_ends() -> None:
    odd = {"otb/split/org/model:v2/total": 1.0, "otb/split/org/model:v2/within": 0.5}
    metrics = odd | {"otb/split/prompts": 8.0, "otb/split/total": 1.0, "otb/split/x/within": 1.0}
    assert split_names(metrics, "otb/split/") == ["org/model:v2"]
    assert split_names(metrics, "otb/split/", ("total", "within")) == ["org/model:v2", "x"]
    negative = odd | {k: STEP[k] for k in STEP if "/grpo/" not in k and "params" not in k}
    assert refused(negative | {"otb/split/org/model:v2/total": -1.0}, "otb/") is not None
