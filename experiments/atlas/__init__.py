"""`ddpbench atlas`: what each DDP option costs on real models, against PyTorch DDP's defaults.

For each model of `plan.MODELS` and each network (loopback, an emulated link), every option of
`plan.VARIANTS` is measured against the defaults at world size 2, interleaved in one set of rank
processes (`interleave.py`), so that a ratio is not the machine's drift between two runs. The parts:

- plan.py: the models, the variants, and the blocks of variants one set of replicas holds (memory);
  every check of the request, before any process starts.
- interleave.py: what a rank runs for one block: a replica per variant, warm-up, shuffled rounds.
- runner.py: blocks on their ranks, one pool of rank processes per network; records as they finish.
- tables.py: records -> paired ratios to the default, with 95% intervals; Markdown and CSV.
- figure.py: the heat map (model x option).
- command.py: the sub-command's options and its entry point.
"""
