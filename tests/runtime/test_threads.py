"""The thread count of a command: --threads, then the user's OMP_NUM_THREADS / MKL_NUM_THREADS,
then the size rule (one thread under `SMALL_MODEL` parameters or with no model, every core
above); applied for the command and restored after it; libgomp's waits made passive unless the
user said otherwise."""

from __future__ import annotations

import os

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from otb_diag.errors import InputError
from otb_diag.runtime.threads import (
    AUTO,
    NO_MODEL,
    SMALL_MODEL,
    Threads,
    calm_waits,
    choose_threads,
    command_threads,
    cores_available,
    parse_threads,
    show_threads,
)

TOY = 621_184  # the embedded default's parameters
SMOLLM2 = 134_515_008


def test_the_order_by_hand() -> None:
    none: dict[str, str] = {}
    # --threads wins over the environment and the size
    assert choose_threads(3, TOY, {"OMP_NUM_THREADS": "2"}, 8) == Threads(3, "--threads")
    # then the user's variable: torch keeps the count it read (None), MKL's where both are set
    assert choose_threads(None, TOY, {"OMP_NUM_THREADS": "4"}, 8) == Threads(
        None, "OMP_NUM_THREADS=4"
    )
    both = {"OMP_NUM_THREADS": "4", "MKL_NUM_THREADS": "2"}
    assert choose_threads(None, SMOLLM2, both, 8).source == "MKL_NUM_THREADS=2"
    assert choose_threads(None, TOY, {"OMP_NUM_THREADS": " "}, 8).count == 1  # blank: unset
    # then the size: no model and small ones on one thread; large and unknown on every core
    assert choose_threads(None, NO_MODEL, none, 8) == Threads(
        1, AUTO, "no model, under 10 million parameters"
    )
    assert choose_threads(None, TOY, none, 8) == Threads(
        1, AUTO, "a model of 0.621 million, under 10 million parameters"
    )
    assert choose_threads(None, SMALL_MODEL - 1, none, 8).count == 1
    assert choose_threads(None, SMALL_MODEL, none, 8).count == 8
    assert choose_threads(None, SMOLLM2, none, 2) == Threads(
        2, AUTO, "every core this process may use, for a model of 135 million parameters"
    )
    assert choose_threads(None, None, none, 8).why.endswith("for a model of unknown size")
    assert choose_threads(None, None, none, 0).count == 1  # never zero threads


ENVS = st.dictionaries(
    st.sampled_from(["OMP_NUM_THREADS", "MKL_NUM_THREADS", "OMP_WAIT_POLICY"]),
    st.sampled_from(["", "1", "3"]),
)


@given(
    option=st.none() | st.integers(1, 64),
    parameters=st.none() | st.integers(0, 10**10),
    more=st.integers(0, 10**10),
    env=ENVS,
    cores=st.integers(1, 256),
)
def test_the_rule_as_properties(option, parameters, more, env, cores) -> None:
    chosen = choose_threads(option, parameters, env, cores)
    user_env = any(env.get(name) for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"))
    if option is not None:
        assert chosen.count == option
    elif user_env:
        assert chosen.count is None and chosen.source in {f"{k}={v}" for k, v in env.items()}
    else:
        assert chosen.count in (1, cores) and chosen.source == AUTO
        # a larger model never gets fewer threads; an unknown size counts as large
        larger = None if parameters is None else parameters + more
        assert choose_threads(option, larger, env, cores).count >= chosen.count
        assert chosen.count == (1 if parameters is not None and parameters < SMALL_MODEL else cores)


@pytest.mark.parametrize(("text", "count"), [("auto", None), (" AUTO ", None), ("3", 3)])
def test_parse_threads(text: str, count: int | None) -> None:
    assert parse_threads(text) == count
    assert parse_threads(show_threads(count)) == count


@pytest.mark.parametrize("text", ["0", "-2", "two", "", "1.5"])
def test_parse_threads_refuses(text: str) -> None:
    with pytest.raises(InputError, match="--threads: must be a whole number from 1 up, or auto"):
        parse_threads(text)


@pytest.fixture
def no_thread_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """No thread variable (conftest sets OMP_NUM_THREADS=1 under xdist; restored after)."""
    for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        monkeypatch.delenv(name, raising=False)


@pytest.mark.usefixtures("no_thread_env")
def test_command_threads_applies_then_restores() -> None:
    before = torch.get_num_threads()
    with command_threads(None, lambda: TOY) as chosen:
        assert chosen.count == 1 and torch.get_num_threads() == 1
    with command_threads(3, lambda: TOY) as chosen:
        assert chosen.count == 3 and torch.get_num_threads() == 3
    assert torch.get_num_threads() == before


def test_command_threads_sizes_the_model_only_when_the_rule_decides(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """--threads or the environment decide without reading a checkpoint; torch keeps the count
    it read from the variable."""

    def unread() -> int:
        raise AssertionError("the model's size was read")

    before = torch.get_num_threads()
    with command_threads(2, unread) as chosen:
        assert chosen.count == 2
    monkeypatch.setenv("OMP_NUM_THREADS", "5")
    with command_threads(None, unread) as chosen:
        assert chosen == Threads(None, "OMP_NUM_THREADS=5")
        assert torch.get_num_threads() == before


def test_cores_available() -> None:
    cores = cores_available()
    assert 1 <= cores <= min(len(os.sched_getaffinity(0)), torch.get_num_threads())


@pytest.mark.parametrize(
    ("env", "after"),
    [
        ({}, {"OMP_WAIT_POLICY": "PASSIVE"}),
        ({"OMP_WAIT_POLICY": "active"}, {"OMP_WAIT_POLICY": "active"}),  # the user's own
        ({"GOMP_SPINCOUNT": "300000"}, {"GOMP_SPINCOUNT": "300000"}),
    ],
)
def test_calm_waits(env: dict[str, str], after: dict[str, str]) -> None:
    calm_waits(env)
    assert env == after
