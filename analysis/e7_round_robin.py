# %% [markdown]
# # E7: round-robin process groups
# Buckets dispatched in turn to 1, 3 or 5 process groups over the same ranks. The paper: more groups
# help, more so on Gloo and for larger models.

# %%
import sys

from analysis.common import latency_against, script_main


def draw() -> None:
    """Plot E7 from results/runs/<machine>/e7_round_robin.jsonl."""
    latency_against("e7_round_robin", "process_groups", "round-robin process groups", "E7: round robin")


def main(argv: list[str] | None = None) -> int:
    """`python analysis/e7_round_robin.py [--records PATH] [--out FOLDER]`: draw(), or 2 without records."""
    return script_main(argv, draw, make="`./run_all.sh`", needs=("e7_round_robin",))


# %%
if __name__ == "__main__":
    sys.exit(main())
