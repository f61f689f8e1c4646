"""The paper's energy figures 3–5 (and energy by training step), in the shared style of
`plots.style`.

Each figure function takes tidy tables (pandas) and returns a matplotlib Figure. No maths beyond
what a plot needs lives here."""

from __future__ import annotations

import math
from collections.abc import Sequence

import matplotlib as mpl
import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle

from otb_diag.plots.style import (
    FAIL_COLOR,
    OKABE_ITO,
    PASS_COLOR,
    STYLE,
    new_figure,
)


def fig3_sequence_energy(sequences: pd.DataFrame, group: str) -> Figure:
    """Total realized energy W(τ) of each response in one group, bars coloured by reward.

    `sequences`: one row per response with columns group, sample, energy, reward, length."""
    seqs = sequences[sequences["group"].astype(str) == str(group)].sort_values("sample")
    fig, ax = new_figure()
    with mpl.rc_context(STYLE):
        colors = [PASS_COLOR if r > 0 else FAIL_COLOR for r in seqs["reward"]]
        ax.bar(seqs["sample"], seqs["energy"], color=colors, width=0.8)
        # At most ~12 tick labels, a power of two apart: legible at column width (4 for M = 32,
        # 16 for M = 128).
        step = 1 if len(seqs) <= 16 else 2 ** math.ceil(math.log2(len(seqs) / 12))
        ax.set_xticks(seqs["sample"].iloc[::step])
        ax.set_xlabel("response in group (sample index)")
        ax.set_ylabel(r"total energy $W(\tau)=\sum_t w_t$")
        ax.set_title(f"Sequence energy within group {group}")
        handles = [
            Rectangle((0, 0), 1, 1, color=PASS_COLOR, label="reward > 0"),
            Rectangle((0, 0), 1, 1, color=FAIL_COLOR, label="reward ≤ 0"),
        ]
        # beside the axes, off the bars (inside, it covered the tallest of them)
        ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.0, 1.0), frameon=False)
    return fig


def spread_samples(sequences: pd.DataFrame, group: str, count: int) -> list[int]:
    """Up to `count` members of `group` with distinct sequence energies, spread evenly over its
    range, so the plotted profiles differ (a group often holds many identical responses, whose
    curves would hide one another). A response with no token (an aborted generation) has no
    profile and is not shown."""
    members = sequences[(sequences["group"].astype(str) == str(group)) & (sequences["length"] > 0)]
    seqs = members.sort_values("energy")
    seqs = seqs.drop_duplicates("energy")
    picks = np.unique(np.linspace(0, len(seqs) - 1, min(count, len(seqs))).round().astype(int))
    return sorted(seqs["sample"].iloc[picks].tolist())


def _same_profiles(curves: dict[int, np.ndarray]) -> dict[int, list[int]]:
    """Samples grouped by identical W_t profiles: first sample -> every sample with its curve."""
    shared: dict[int, list[int]] = {}
    for s, curve in curves.items():
        twin = next((k for k in shared if np.array_equal(curves[k], curve)), None)
        shared.setdefault(s if twin is None else twin, []).append(s)
    return shared


def fig4_cumulative_energy(
    tokens: pd.DataFrame, samples: Sequence[int], group: str, fractions=(0.25, 0.5, 0.75)
) -> Figure:
    """Cumulative realized energy W_t against t for `samples` of one group, with their energy
    ranking (lowest → highest) at 25/50/75 % of the longest shown response; a finished response
    keeps its total, as in `groups.csv`. Samples with identical profiles share one line and one
    legend entry (`seq 3 = 5`); a marker on every token keeps overlapping stretches visible;
    legend and ranking sit beside the axes, off the curves.

    `tokens`: one row per response token with columns group, sample, t, W."""
    toks = tokens[tokens["group"].astype(str) == str(group)]
    palette = list(OKABE_ITO.values())[1:] + [OKABE_ITO["black"]]
    markers = ("o", "s", "^", "D", "v", "P", "X", "*")
    fig, ax = new_figure(height_in=2.6)
    with mpl.rc_context(STYLE):
        curves, positions = {}, {}
        for s in samples:
            curve = toks[toks["sample"] == s].sort_values("t")
            curves[s], positions[s] = curve["W"].to_numpy(), curve["t"].to_numpy()
        for k, (s, members) in enumerate(_same_profiles(curves).items()):
            ax.plot(
                positions[s],
                curves[s],
                color=palette[k % len(palette)],
                marker=markers[k % len(markers)],
                markersize=2.5,
                label="seq " + " = ".join(str(m) for m in members),
            )
        longest = max((len(c) for c in curves.values()), default=0)
        rankings = []
        for f in fractions:
            pos = max(0, int(np.ceil(f * longest)) - 1)
            at = {s: c[min(pos, len(c) - 1)] for s, c in curves.items()}
            order = " < ".join(str(s) for s, _ in sorted(at.items(), key=lambda kv: kv[1]))
            rankings.append(f"t={pos}: {order}")
            ax.axvline(pos, color="0.5", linestyle=":", linewidth=0.8)
        ax.set_xlabel("response position t (tokens)")
        ax.set_ylabel(r"realized energy $W_t=\sum_{j\leq t} m_j w_j$")
        ax.set_title(f"Energy profiles in group {group}")
        ax.xaxis.get_major_locator().set_params(integer=True)
        ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), frameon=False)
        ax.text(
            0.0,
            -0.22,
            "ranking by W_t, low → high\n" + "\n".join(rankings),
            transform=ax.transAxes,
            va="top",
            ha="left",
            fontsize=6,
            family="monospace",
        )
    return fig


def envelope(p: np.ndarray, vocab_size: int | None) -> tuple[np.ndarray, np.ndarray]:
    """Bounds of w at τ = 1 for a token of probability p (docs/theory.md §2):
    lower (1−p)² + (1−p)²/(V−1) (other mass spread uniformly; V unknown → V → ∞),
    upper 2(1−p)² (all other mass on one token)."""
    q = (1.0 - p) ** 2
    return q + (q / (vocab_size - 1) if vocab_size else 0.0), 2.0 * q


def fig5_probability_vs_gradient(tokens: pd.DataFrame, vocab_size: int | None) -> Figure:
    """Token probability against the logit-gradient norm w over all generated tokens (hexbin, log
    colour), with the analytic envelope. w is scaled to τ = 1 (w·τ²) so the envelope applies.

    `tokens`: columns prob, w, mask and (optionally) temperature."""
    toks = tokens[tokens["mask"] > 0]
    tau = toks["temperature"].to_numpy() if "temperature" in toks else 1.0
    w_unit = toks["w"].to_numpy() * np.square(tau)
    fig, ax = new_figure(height_in=2.7)
    with mpl.rc_context(STYLE):
        hb = ax.hexbin(
            toks["prob"],
            w_unit,
            gridsize=40,
            bins="log",
            cmap="viridis",
            mincnt=1,
            extent=(0, 1, 0, 2),
        )
        if len(toks):  # no generated token (every generation aborted): no colour scale to draw
            fig.colorbar(hb, ax=ax, label="tokens (log scale)")
        p = np.linspace(0, 1, 200)
        lower, upper = envelope(p, vocab_size)
        ax.plot(p, upper, color=OKABE_ITO["vermillion"], linestyle="--", label=r"$2(1-p)^2$")
        ax.plot(p, lower, color=OKABE_ITO["orange"], linestyle="--", label=r"$(1-p)^2\,V/(V-1)$")
        ax.set_xlabel(r"token probability $p_t$")
        ax.set_ylabel(r"$w_t=\|\partial \log p_t/\partial z_t\|^2$ (τ=1 units)")
        ax.set_title(f"Confidence vs. logit-gradient norm ({len(toks):,} tokens)")
        ax.legend(loc="upper right", frameon=False)
    return fig


def fig_energy_by_step(sequences: pd.DataFrame) -> Figure:
    """Distribution of sequence energy W(τ) at each checkpoint step (box plot, log scale).

    `sequences`: columns step, energy."""
    steps = sorted(sequences["step"].unique())
    data = [sequences.loc[sequences["step"] == s, "energy"].to_numpy() for s in steps]
    fig, ax = new_figure()
    with mpl.rc_context(STYLE):
        ax.boxplot(
            data, tick_labels=[str(s) for s in steps], showfliers=True, flierprops={"markersize": 2}
        )
        ax.set_yscale("log")
        ax.set_xlabel("training step of the checkpoint")
        ax.set_ylabel(r"sequence energy $W(\tau)$")
        ax.set_title("Realized energy across checkpoints")
    return fig
