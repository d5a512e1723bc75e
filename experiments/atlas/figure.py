"""The atlas's one figure: a heat map per network (model x option), coloured by the option's latency over
the default's on a log scale centred on 1 (blue faster, red slower), each cell labelled with its ratio,
and framed and marked `*` where it differs after the Benjamini-Hochberg correction over its network's cells."""
from __future__ import annotations

import math
from pathlib import Path

from experiments.atlas.tables import link_name

SPAN = math.log2(2.0)  # colours saturate at 2x faster or slower


def heat_map(table: list[dict], path: Path) -> None:
    """Draw the rows of tables.rows into one PNG at `path`, one panel per network."""
    import matplotlib

    matplotlib.use("Agg")  # files only, no screen
    import matplotlib.pyplot as plt
    import numpy as np
    from matplotlib.patches import Rectangle

    links = list(dict.fromkeys(r["link"] for r in table))
    options = list(dict.fromkeys(r["option"] for r in table))
    models = list(dict.fromkeys(r["model"] for r in table))
    found = {(r["link"], r["model"], r["option"]): r for r in table}
    width = 1.2 + 0.75 * len(options)
    figure, axes = plt.subplots(1, len(links), figsize=(width * len(links), 1.2 + 0.42 * len(models)),
                                squeeze=False, constrained_layout=True)
    cmap = plt.get_cmap("RdBu_r").with_extremes(bad="0.85")  # grey: not measured, or failed
    for axis, link in zip(axes[0], links):
        values = np.full((len(models), len(options)), np.nan)
        for i, model in enumerate(models):
            for j, option in enumerate(options):
                row = found.get((link, model, option))
                if row is not None and row["ratio"] is not None:
                    values[i, j] = math.log2(row["ratio"])
        image = axis.imshow(np.ma.masked_invalid(values), cmap=cmap, vmin=-SPAN, vmax=SPAN, aspect="auto")
        for i, model in enumerate(models):
            for j, option in enumerate(options):
                row = found.get((link, model, option))
                if row is None or row["ratio"] is None:
                    axis.text(j, i, "-" if row is None else "failed", ha="center", va="center", fontsize=7)
                    continue
                mark = "*" if row["significant"] else ""
                axis.text(j, i, f"{row['ratio']:.2f}{mark}", ha="center", va="center", fontsize=7,
                          fontweight="bold" if mark else "normal",
                          color="white" if abs(values[i, j]) > 0.6 * SPAN else "black")
                if mark:
                    axis.add_patch(Rectangle((j - 0.5, i - 0.5), 1, 1, fill=False, edgecolor="black", linewidth=1.2))
        axis.set_xticks(range(len(options)), options, rotation=45, ha="right", fontsize=8)
        axis.set_yticks(range(len(models)), models, fontsize=8)
        axis.set_title(link_name(link), fontsize=9)
    bar = figure.colorbar(image, ax=axes[0].tolist(), shrink=0.8)
    ticks = [0.5, 0.7, 1.0, 1.4, 2.0]
    bar.set_ticks([math.log2(t) for t in ticks], labels=[f"{t:g}x" for t in ticks])
    bar.set_label("latency / default's", fontsize=8)
    figure.suptitle("Each DDP option's latency over PyTorch DDP's defaults (world size 2, interleaved); "
                    "* and frame: a difference after Benjamini-Hochberg over the network's cells (FDR 5%)", fontsize=9)
    figure.savefig(path, dpi=130)
    plt.close(figure)
