"""ddpbench experiments: launching ranks, workloads and the measured training loop."""
