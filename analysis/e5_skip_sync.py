# %% [markdown]
# # E5: skipping synchronisation, speed
# All-reduce every n iterations (no_sync() in between). The paper: average latency falls as n grows
# (about 15/25/38% at n = 2/4/8 on 256 GPUs with NCCL). Each sample is the mean latency of one cycle
# of n iterations, so that the synchronised iteration is weighed in.

# %%
import sys

from analysis.common import latency_against, script_main


def draw() -> None:
    """Plot E5 from results/runs/<machine>/e5_skip_sync.jsonl."""
    latency_against("e5_skip_sync", "sync_every", "reduce every n iterations", "E5: skip sync", xscale="log",
                    per_cycle=True)


def main(argv: list[str] | None = None) -> int:
    """`python analysis/e5_skip_sync.py [--records PATH] [--out FOLDER]`: draw(), or 2 without records."""
    return script_main(argv, draw, make="`./run_all.sh`", needs=("e5_skip_sync",))


# %%
if __name__ == "__main__":
    sys.exit(main())
