# %% [markdown]
# # E3: latency against bucket size
# Bucket caps from 0 (one parameter per all-reduce) to 200 MB. The paper: the best cap lies between the
# extremes and grows with model size; a good cap can more than double speed against a bad one.

# %%
import sys

from analysis.common import latency_against, script_main


def draw() -> None:
    """Plot E3 from results/runs/<machine>/e3_bucket_size.jsonl."""
    latency_against("e3_bucket_size", "bucket_mb", "bucket cap (MB; 0 = one parameter per bucket)",
                    "E3: bucket size", xscale="symlog")


def main(argv: list[str] | None = None) -> int:
    """`python analysis/e3_bucket_size.py [--records PATH] [--out FOLDER]`: draw(), or 2 without records."""
    return script_main(argv, draw, make="`./run_all.sh`", needs=("e3_bucket_size",))


# %%
if __name__ == "__main__":
    sys.exit(main())
