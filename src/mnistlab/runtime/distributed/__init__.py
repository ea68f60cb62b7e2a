"""How a run's processes meet: Lightning's launcher, torchrun, srun, machines by hand or Ray (one run
folder, one log per rank, a lost rank in bounded time), and how a global batch is cut into per-rank
shards so that metrics count every sample once on any number of processes.

It imports ``run/`` and ``config/`` of the machinery.
"""
