"""fig4 hides no sequence: picked samples have distinct energies, identical profiles share one
line and one legend entry, and the legend sits outside the axes."""

import numpy as np
import pandas as pd

from otb_diag.plots.energy import fig4_cumulative_energy, spread_samples


def tokens_and_sequences() -> tuple[pd.DataFrame, pd.DataFrame]:
    """Group g of 4 responses; samples 0 and 1 are identical, 2 and 3 differ."""
    w = {0: [0.5, 0.1], 1: [0.5, 0.1], 2: [1.0, 1.0, 1.0], 3: [0.2]}
    rows = [
        {"group": "g", "sample": s, "t": t, "W": float(np.cumsum(ws)[t])}
        for s, ws in w.items()
        for t in range(len(ws))
    ]
    energy = {s: float(sum(ws)) for s, ws in w.items()}
    lengths = [len(ws) for ws in w.values()]
    sequences = pd.DataFrame(
        {"group": "g", "sample": list(w), "energy": list(energy.values()), "length": lengths}
    )
    return pd.DataFrame(rows), sequences


def test_spread_samples_skips_duplicate_energies() -> None:
    _, sequences = tokens_and_sequences()
    picked = spread_samples(sequences, "g", count=8)
    assert picked == [0, 2, 3]  # sample 1 repeats sample 0's energy


def test_spread_samples_leaves_out_an_empty_response() -> None:
    _, sequences = tokens_and_sequences()
    empty = pd.DataFrame({"group": ["g"], "sample": [4], "energy": [0.0], "length": [0]})
    assert spread_samples(pd.concat([sequences, empty]), "g", count=8) == [0, 2, 3]


def test_identical_profiles_share_a_legend_entry_outside_the_axes() -> None:
    tokens, _ = tokens_and_sequences()
    fig = fig4_cumulative_energy(tokens, [0, 1, 2, 3], "g")
    ax = fig.axes[0]
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert labels == ["seq 0 = 1", "seq 2", "seq 3"]
    assert len(ax.get_lines()) - 3 == 3  # three curves plus three dotted rank positions
    fig.canvas.draw()
    legend = ax.get_legend().get_window_extent()
    assert legend.x0 >= ax.get_window_extent().x1 - 1  # beside the axes, not over the curves
