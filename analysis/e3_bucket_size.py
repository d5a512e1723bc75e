# %% [markdown]
# # E3: latency against bucket size
# Bucket caps from 0 (one parameter per all-reduce) to 200 MB. The paper: the best cap lies between the
# extremes and grows with model size; a good cap can more than double speed against a bad one.

# %%
from analysis.common import latency_against


def main() -> None:
    """Plot E3 from results/runs/<machine>/e3_bucket_size.jsonl."""
    latency_against("e3_bucket_size", "bucket_mb", "bucket cap (MB; 0 = one parameter per bucket)",
                    "E3: bucket size", xscale="symlog")


# %%
if __name__ == "__main__":
    main()
