# %% [markdown]
# # E6: skipping synchronisation, convergence
# Training loss per iteration for reduce-every n = 1, 2, 4, 8 on a task with a known solution (a
# student network imitating a fixed random teacher). The paper: no visible harm at small batch.

# %%
import sys

import pandas as pd

from analysis.common import caption, figure, runs, save, script_main


def draw() -> None:
    """Plot E6 from results/runs/<machine>/e6_convergence.jsonl."""
    frame = runs("e6_convergence", kind="train")
    if frame.empty:
        save(None, frame, "e6_convergence", note="no records; skipped")
        return
    fig, (ax,) = figure(caption(frame))
    rows = []
    for record in frame.sort_values("sync_every").itertuples():
        loss = pd.Series(record.loss)
        window = max(1, len(loss) // 40)
        ax.plot(loss.rolling(window, min_periods=1).mean(), label=f"n = {record.sync_every}")
        tail = loss.iloc[-max(1, len(loss) // 10):]
        rows.append({"sync_every": record.sync_every, "world_size": record.world_size, "iterations": len(loss),
                     "first_loss": loss.iloc[:window].mean(), "final_loss_median": tail.median(),
                     "final_loss_q25": tail.quantile(0.25), "final_loss_q75": tail.quantile(0.75),
                     "accuracy": record.summary_accuracy})
    # Runs shorter than 80 iterations are drawn unsmoothed: a "moving mean over 1" says nothing.
    smoothing = f"moving mean over {window} iterations" if window > 1 else "per iteration"
    ax.set(xlabel="iteration", ylabel=f"training loss ({smoothing}, mean over ranks)", yscale="log",
           title="E6: convergence with reduce every n iterations")
    ax.grid(True, alpha=0.3)
    ax.legend()
    save(fig, pd.DataFrame(rows), "e6_convergence")


def main(argv: list[str] | None = None) -> int:
    """`python analysis/e6_convergence.py [--records PATH] [--out FOLDER]`: draw(), or 2 without records."""
    return script_main(argv, draw, make="`./run_all.sh`", needs=("e6_convergence",))


# %%
if __name__ == "__main__":
    sys.exit(main())
