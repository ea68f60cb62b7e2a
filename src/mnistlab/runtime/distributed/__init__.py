"""How a run's processes meet: Lightning's launcher, torchrun, srun, machines by hand or Ray (one run
folder, one log per rank, a lost rank in bounded time).

It imports ``run/`` and ``config/`` of the machinery.
"""
