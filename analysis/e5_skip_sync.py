# %% [markdown]
# # E5: skipping synchronisation, speed
# All-reduce every n iterations (no_sync() in between). The paper: average latency falls as n grows
# (about 15/25/38% at n = 2/4/8 on 256 GPUs with NCCL). Each sample is the mean latency of one cycle
# of n iterations, so that the synchronised iteration is weighed in.

# %%
from analysis.common import latency_against


def main() -> None:
    """Plot E5 from results/runs/<machine>/e5_skip_sync.jsonl."""
    latency_against("e5_skip_sync", "sync_every", "reduce every n iterations", "E5: skip sync", xscale="log",
                    per_cycle=True)


# %%
if __name__ == "__main__":
    main()
