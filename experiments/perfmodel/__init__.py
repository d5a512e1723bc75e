"""A performance model of DDP: predict per-iteration latency from a one-process profile.

- `profile`: measure, in one process, when each gradient becomes ready during backward, and the
  forward, backward and optimizer times (ddp_core's reducer observer reports each gradient);
- `comm`: an all-reduce cost model per backend, fitted to the all-reduce microbenchmark, and named
  cluster presets for extrapolation;
- `simulate`: DDP's schedule replayed over buckets (the same bucket assignment as ddp_core);
- `commands`: `ddpbench profile | predict | tune-bucket | validate`.
"""
