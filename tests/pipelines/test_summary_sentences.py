"""Every summary sentence says what its table says (issue 53): `energy`'s no-signal sentence is
read off the proxies' rows as printed (all-equal rewards: OTB's row is verl's zero tail, not 0;
groups of one: every baseline's row is none's), and `variance-compare`'s paper-claim sentence
prints N′'s and the saving's intervals as the bounds its verdicts read (an interval reaching
past the pools' largest N is unbounded, and the verdict follows from the printed ends)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from types import SimpleNamespace

import pytest
from hypothesis import given
from hypothesis import strategies as st
from unwritten_figures import unwritten_figures
from zero_tail_step import BODY, LONGEST, SECOND, TAIL, W_BODY, W_TAIL, row

from otb_diag.errors import InputError
from otb_diag.maths import interval_verdict
from otb_diag.pipelines.energy.recipe import run_energy
from otb_diag.pipelines.inputs import EnergyInputs
from otb_diag.pipelines.results.energy import PROXY_COLUMNS, EnergyResult
from otb_diag.pipelines.results.schema import counted
from otb_diag.pipelines.results.variance import (
    CLAIM_EQUIVALENT_N,
    CLAIM_N,
    PAPER_TOKEN_SAVING,
)
from otb_diag.pipelines.variance.conclusions import claim_verdict
from otb_diag.pipelines.variance.recipe import check_pools
from otb_diag.pipelines.variance.settings import VarianceSettings


def _energy(tmp: Path, name: str, rows: list[dict]) -> tuple[EnergyResult, list[str]]:
    path = tmp / f"{name}.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    said: list[str] = []
    with unwritten_figures():
        result = run_energy(
            EnergyInputs(rollouts=path, model_free=True),
            tmp / name,
            progress=False,
            say=said.append,
        )
    assert result is not None
    return result, said


@pytest.fixture(scope="module")
def no_signal(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[EnergyResult, list]]:
    """`energy --model-free` on two all-correct groups (lengths 2, 2, 3, 6: one strictly longest
    member, a zero tail of 3 tokens) and on four groups of one response (rewards 0 and 1)."""
    tmp = tmp_path_factory.mktemp("no-signal")
    equal = [
        row(g, [BODY] * SECOND + [TAIL] * (LONGEST - SECOND), 1.0)
        if n == LONGEST
        else row(g, [BODY] * n, 1.0)
        for g in ("a", "b")
        for n in (2, 2, SECOND, LONGEST)
    ]
    ones = [row(f"g{i}", [BODY] * (2 + i), float(i % 2)) for i in range(4)]
    return {"equal": _energy(tmp, "equal", equal), "ones": _energy(tmp, "ones", ones)}


def printed_table(text: str) -> dict[str, list[str]]:
    """The proxies' table as `format()` prints it: baseline -> its cells."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.split()[:1] == ["baseline"])
    assert lines[start].split()[1:] == list(PROXY_COLUMNS)
    table = {}
    for line in lines[start + 1 :]:
        cells = line.split()
        if len(cells) != 1 + len(PROXY_COLUMNS):
            break
        table[cells[0]] = cells[1:]
    return table


def names(found: list[str]) -> str:
    return found[0] if len(found) == 1 else f"{', '.join(found[:-1])} and {found[-1]}"


@pytest.mark.slow  # two real (model-free) energy runs: seconds
def test_all_equal_rewards_name_exactly_the_rows_that_are_0(no_signal: dict) -> None:
    """Every group all-correct: the rows printed 0 are named 0, and OTB's row, which is not
    (verl's zero tail: the longest member keeps A = R on its last 3 tokens), is named with its
    printed numbers and where they come from; no row is said to be 0 that does not print 0."""
    result, _ = no_signal["equal"]
    text = result.format()
    sentence, table = text.splitlines()[0], printed_table(text)
    zero = [n for n, cells in table.items() if n != "none" and set(cells) == {"0"}]
    assert zero == ["mean", "grpo", "rloo", "optseq"]  # the group baselines give A = 0 exactly
    assert sentence.startswith(
        "no signal: each of the 2 groups has equal rewards within it, so no baseline can be "
        f"told from another: the proxies of {names(zero)} below are 0 and compare nothing; "
    )
    # OTB: in each group the longest member's Ā = 3/6 (A = 1 on 3 of its 6 tokens), by hand.
    w_longest = SECOND * W_BODY + (LONGEST - SECOND) * W_TAIL
    otb = result.proxies["otb"]
    assert otb["proxy2_total_power"] == pytest.approx(2 * 0.5**2 * w_longest / 8, rel=1e-5)
    assert table["otb"] == [f"{otb[c]:.4g}" for c in PROXY_COLUMNS] and "0" not in table["otb"]
    assert f"otb's are neither 0 nor none's: {' / '.join(table['otb'])}, all of it in verl's " in (
        sentence
    )
    assert sentence.endswith(". The energies need no reward and are measured.")


@pytest.mark.slow  # two real (model-free) energy runs: seconds
def test_groups_of_one_say_every_row_is_nones_and_warn_at_reading(no_signal: dict) -> None:
    """Four groups of one response: every group baseline is 0, so every row prints none's, and
    the sentence says so of exactly those rows; reading them gave a warning."""
    result, said = no_signal["ones"]
    text = result.format()
    sentence, table = text.splitlines()[0], printed_table(text)
    like_none = [n for n, cells in table.items() if n != "none" and cells == table["none"]]
    assert like_none == [n for n in table if n != "none"]  # all of them
    assert set(table["none"]) != {"0"}
    assert sentence == (
        "no signal: each of the 4 groups holds one response, and with groups of one every "
        f"group baseline is 0: the proxies of {names(like_none)} equal none's and compare "
        "nothing. The energies need no reward and are measured."
    )
    assert said == [
        "warning: every one of the 4 groups holds one response: with groups of one every group "
        "baseline (mean, rloo, otb, ...) is 0 and equals none, so the rewards give no group "
        "baseline signal; sample pools of 2 or more responses per prompt (rollouts sample --n)"
    ]


def test_counts_take_their_number() -> None:
    assert counted(1, "token") == "1 token"
    assert counted(6, "token") == "6 tokens"
    assert counted(1, "finished batch", "finished batches") == "1 finished batch"
    assert counted(2, "finished batch", "finished batches") == "2 finished batches"


# ---------------------------------------------------------------------------------------------
# variance-compare: the pools read, then the group sizes; the paper-claim sentence
# ---------------------------------------------------------------------------------------------


def _pools(*sizes: int) -> SimpleNamespace:
    """What `check_pools` reads of a `RolloutSet`: each group's rows."""
    start, groups = 0, {}
    for g, m in enumerate(sizes):
        groups[f"p{g}"] = list(range(start, start + m))
        start += m
    return SimpleNamespace(groups=groups)


def test_a_group_size_the_pools_cannot_draw_stops_before_any_forward_pass() -> None:
    said: list[str] = []
    with pytest.raises(InputError, match=r"--group-sizes: 16 is above half the smallest pool"):
        check_pools(_pools(32, 16), VarianceSettings(group_sizes=(2, 4, 16)), said.append)
    # the default's sizes above M/2 are left out, said
    check_pools(_pools(32, 16), VarianceSettings(), said.append)
    assert said == [
        "note: the default group sizes 16,32,64 are left out: above half the smallest pool "
        "(group p1 holds M = 16 responses, so N ≤ 8: the draws of N from M stay varied)"
    ]
    with pytest.raises(InputError, match="above half the smallest pool"):  # nothing left
        check_pools(_pools(3, 3), VarianceSettings(), said.append)


def test_groups_of_one_are_said_when_variance_reads_them() -> None:
    said: list[str] = []
    with pytest.raises(InputError, match="--group-sizes: 2 is above half the smallest pool"):
        check_pools(_pools(1, 1, 1), VarianceSettings(group_sizes=(2,)), said.append)
    assert said[0].startswith("warning: every one of the 3 groups holds one response")


def _printed_end(text: str, high: bool, scale: float = 1.0) -> float:
    """An interval's end as printed, as a number a verdict reads: `∞` and `100 %` (N′ → ∞)
    unbounded, `≤ x` as a low end unbounded below (any smaller value), `> x`/`≥ x` the bound."""
    text = text.strip().replace("−", "-")
    if text == "∞" or (high and text == "100 %"):
        return float("inf")
    number = float(re.sub(r"[^0-9.\-]", "", text)) / scale
    return -float("inf") if text.startswith("≤") and not high else number


def _interval(sentence: str, label: str, scale: float = 1.0) -> tuple[float, float]:
    """The printed 95 % interval of the claim sentence's `label` (N′'s, then the saving's)."""
    found = re.findall(r"95 % interval ([^()]*?) to ([^,()]*)", sentence)
    low, high = found[0] if label == "N′" else found[1]
    return _printed_end(low, False, scale), _printed_end(high, True, scale)


ENDS = st.sampled_from(["within", "beyond", "below"])


@st.composite
def evidence(draw: st.DrawFn) -> SimpleNamespace:
    """N′ at N = 4 with its interval, as `derived_intervals` gives it: each end a value and
    where it lies among the measured N (2 .. max N), the savings 1 − 4/N′ at each."""
    max_n = draw(st.sampled_from([4, 8, 16, 32, 64]))
    ends = []
    for _ in range(2):
        where = draw(ENDS)
        value = {
            "within": draw(st.floats(2.0, float(max_n))),
            "beyond": float("inf"),
            "below": 2.0,
        }[where]
        ends.append((value, where))
    (low, low_where), (high, high_where) = sorted(ends, key=lambda e: e[0])
    if low_where == "beyond":  # an interval whose low end is past max N has its high end too
        high_where = "beyond"

    def saving(n: float, where: str) -> float:
        return 1 - CLAIM_N / (max_n if where == "beyond" else n)

    point = draw(st.floats(low if low_where != "beyond" else max_n, float(max_n)))
    return SimpleNamespace(
        max_n=max_n,
        equivalent_mean_group_size=point,
        equivalent_range="within",
        equivalent_low=low,
        equivalent_low_range=low_where,
        equivalent_high=high,
        equivalent_high_range=high_where,
        token_savings=1 - CLAIM_N / point,
        token_savings_low=saving(low, low_where),
        token_savings_high=saving(high, high_where),
    )


@given(evidence())
def test_the_printed_intervals_decide_as_the_verdicts_do(e: SimpleNamespace) -> None:
    """Read back from the sentence alone, N′'s interval gives the verdict on N′ ≥ 32 and the
    saving's the verdict on > 65 %, as printed: a reader of the interval and of the verdict
    reads one bound (an end past the largest N is printed unbounded, ∞ and 100 %)."""
    claim = claim_verdict("head", e, e.max_n)
    n_low, n_high = _interval(claim.text, "N′")
    s_low, s_high = _interval(claim.text, "saving", scale=100)
    assert claim.verdict == interval_verdict.at_least(n_low, n_high, CLAIM_EQUIVALENT_N)
    assert claim.saving_verdict == interval_verdict.at_least(s_low, s_high, PAPER_TOKEN_SAVING)
    assert f"N = {CLAIM_N} ≈ N = {CLAIM_EQUIVALENT_N} at equal variance: {claim.verdict}" in (
        claim.text
    )


def test_an_interval_past_the_largest_n_prints_unbounded_and_is_not_resolved() -> None:
    """The SmolLM2 run of issue 53 (pools of 8: N up to 4): N′'s interval 2.6 to past 4 printed
    '≥ 0 %' as the saving's upper end while its verdict said the interval reaches 65 %. Now the
    upper end is printed as the verdict reads it: unbounded."""
    e = SimpleNamespace(
        equivalent_mean_group_size=4.0,
        equivalent_range="beyond",
        equivalent_low=2.6,
        equivalent_low_range="within",
        equivalent_high=float("inf"),
        equivalent_high_range="beyond",
        token_savings=0.0,
        token_savings_low=1 - 4 / 2.6,
        token_savings_high=0.0,
    )
    text = claim_verdict("head", e, 4).text
    assert "matches mean at N′ > 4 (95 % interval 2.6 to ∞, its upper end past N = 4, the " in text
    assert "at least 0 % fewer sampled tokens (95 % interval −54 % to 100 %)" in text
    assert "> 65 % fewer tokens at equal variance: not resolved (the interval reaches 65 %" in text
    assert "≥ 0 %" not in text
