"""Per-commit latency regression testing: did this commit make DDP slower?

- `compare`: two sets of records, config by config: the ratio NEW/BASE with an interval and a verdict;
- `ab`: two git revisions checked out side by side and run interleaved, round by round, then compared;
- `history`: a preset's latency per commit, recorded under results/history/, plotted, and published
  as a static page (`--html`);
- `drill`: realistic regressions injected as throwaway commits; their true size measured apart
  from the gate, then how often `ab` flags each.
"""
