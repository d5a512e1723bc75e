# %% [markdown]
# # E7: round-robin process groups
# Buckets dispatched in turn to 1, 3 or 5 process groups over the same ranks. The paper: more groups
# help, more so on Gloo and for larger models.

# %%
from analysis.common import latency_against


def main() -> None:
    """Plot E7 from results/runs/<machine>/e7_round_robin.jsonl."""
    latency_against("e7_round_robin", "process_groups", "round-robin process groups", "E7: round robin")


# %%
if __name__ == "__main__":
    main()
