"""How a run's processes start and agree: Lightning's launcher, torchrun, srun or machines by hand
(one run folder, one log per rank, a lost rank in bounded time), and how a global batch is cut into
per-rank shards so that metrics count every sample once on any number of processes.
"""
