import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from scipy.stats import kendalltau

from otb_diag.maths.energy.heterogeneity import (
    HETEROGENEITY,
    frozen_paths,
    group_heterogeneity,
    kendall_tau_b,
    quantile_positions,
    rank_changes,
    tie_keys,
)


def test_quantile_positions_of_shortest_member():
    # shortest is 8: ceil(0.25*8)-1 = 1, ceil(0.5*8)-1 = 3, ceil(0.75*8)-1 = 5
    assert quantile_positions([8, 20, 11]) == [1, 3, 5]
    assert quantile_positions([1, 5]) == [0, 0, 0]


def test_frozen_paths_pad_with_final_value():
    m = frozen_paths([np.array([1.0, 2.0]), np.array([0.5, 0.6, 0.7, 3.0])])
    np.testing.assert_array_equal(m, [[1, 2, 2, 2], [0.5, 0.6, 0.7, 3.0]])


def test_rank_changes_hand_case():
    # a: 1 2 3 (frozen 3 3), b: 0 3 4 5 6 -> order at t=0: b<a ; t=1: a<b ; t=2: a<b ; ...
    a = np.array([1.0, 2.0, 3.0])
    b = np.array([0.0, 3.0, 4.0, 5.0, 6.0])
    assert rank_changes([a, b]) == 1
    # c overtakes both at t=2 and falls back at t=3 (its path is not monotone on purpose)
    c = np.array([-1.0, -1.0, 10.0, -2.0])
    assert rank_changes([a, b, c]) == 3  # t=1 (a/b swap), t=2 (c to top), t=3 (c to bottom)


def test_group_heterogeneity_hand_case():
    paths = [np.array([1.0, 2.0, 3.0, 4.0]), np.array([2.0, 2.5, 3.0, 3.5, 8.0, 12.0])]
    out = group_heterogeneity(paths)
    totals = np.array([4.0, 12.0])
    assert out["energy_cv"] == pytest.approx(totals.std() / totals.mean())  # 4/8 = 0.5
    assert out["energy_cv"] == pytest.approx(0.5)
    assert out["energy_max_min_ratio"] == pytest.approx(3.0)
    # 25/50/75 % of length 4 -> t = 0, 1, 2; W there (1,2) (2,2.5) (3,3); totals (4,12)
    assert out["kendall_tau_25"] == pytest.approx(1.0)
    assert out["kendall_tau_50"] == pytest.approx(1.0)
    assert math.isnan(out["kendall_tau_75"])  # tie at t=2: Kendall τ-b undefined for a constant
    # a frozen at 4 after t=3: t=3 4 > 3.5 (b overtaken), t=4 4 < 8 (b ahead again)
    assert out["rank_changes"] == 2.0


def test_tie_keys_merge_near_ties_only():
    v = np.array([3.0, 1.0, 1.0 + 1e-12, 2.0, 1.0 + 1e-3])
    np.testing.assert_array_equal(tie_keys(v), [3, 0, 0, 2, 1])
    # column-wise on [N, T]
    m = np.array([[0.0, 5.0], [0.0, 5.0 * (1 + 1e-9)], [1.0, 4.0]])
    np.testing.assert_array_equal(tie_keys(m), [[0, 1], [0, 1], [1, 0]])


def test_last_bit_noise_is_not_a_rank_change():
    # the case hypothesis found in CI: two paths equal up to one ulp must not swap ranks
    a = np.cumsum(np.array([0.0, 2.9013538812525838e-18]) + 0.01)
    b = np.cumsum(np.array([0.0, 0.0]) + 0.01)
    assert rank_changes([a, b]) == 0
    assert rank_changes([7.0 * a, 7.0 * b]) == 0
    # a real overtaking (far above TIE_RTOL) still counts
    assert rank_changes([np.array([1.0, 2.0]), np.array([1.5, 1.9])]) == 1


def test_group_of_one_is_not_an_error():
    out = group_heterogeneity([np.array([0.2, 0.9])])
    assert out["energy_cv"] == 0.0
    assert math.isnan(out["kendall_tau_50"])


@given(st.lists(st.lists(st.floats(0, 5), min_size=1, max_size=12), min_size=2, max_size=6))
def test_cv_and_ratio_are_scale_free(increments):
    paths = [np.cumsum(np.array(inc) + 0.01) for inc in increments]
    a = group_heterogeneity(paths)
    b = group_heterogeneity([7.0 * p for p in paths])
    assert a["energy_cv"] == pytest.approx(b["energy_cv"], rel=1e-9)
    assert a["energy_max_min_ratio"] == pytest.approx(b["energy_max_min_ratio"], rel=1e-9)
    assert a["rank_changes"] == b["rank_changes"]


def test_json_text_is_strict_json():
    import json

    from otb_diag.io.atomic import json_text

    text = json_text({"a": math.inf, "b": [math.nan, 1.5], "c": {"d": -math.inf}})
    assert json.loads(text) == {"a": None, "b": [None, 1.5], "c": {"d": None}}


def test_atomic_writes_leave_nothing_behind_and_normal_permissions(tmp_path):
    import os

    from otb_diag.io.atomic import write_text, write_with

    umask = os.umask(0o022)
    try:
        write_text(tmp_path / "a.txt", "x")
        assert (tmp_path / "a.txt").stat().st_mode & 0o777 == 0o644

        def fail(path):
            path.write_text("half")
            raise RuntimeError("boom")

        with pytest.raises(RuntimeError):
            write_with(tmp_path / "b.txt", fail)
    finally:
        os.umask(umask)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.txt"]


@given(
    st.lists(st.tuples(st.integers(0, 4), st.integers(0, 4)), min_size=2, max_size=20),
)
def test_kendall_tau_b_is_scipys(pairs: list[tuple[int, int]]) -> None:
    """Tie-heavy integer rankings (what `tie_keys` gives): scipy's τ-b, NaN where it is NaN."""
    x, y = (np.array(v, dtype=np.int64) for v in zip(*pairs, strict=True))
    ours = kendall_tau_b(x, y)
    theirs = float(kendalltau(x, y).statistic)
    if math.isnan(theirs):
        assert math.isnan(ours)
    else:
        assert ours == pytest.approx(theirs, rel=1e-12, abs=1e-12)


def test_an_empty_response_is_left_out_of_its_groups_heterogeneity():
    """An aborted generation has no W_t path: the group's statistics are those of its other
    members (no IndexError), and all NaN when no member has a token."""
    paths = [np.array([1.0, 2.0, 4.0]), np.array([0.5, 3.0])]
    with_empty = group_heterogeneity([paths[0], np.array([]), paths[1]])
    np.testing.assert_equal(with_empty, group_heterogeneity(paths))
    assert list(with_empty) == list(HETEROGENEITY)
    nothing = group_heterogeneity([np.array([]), np.array([])])
    assert list(nothing) == list(HETEROGENEITY)
    assert all(math.isnan(v) for v in nothing.values())
