"""What Hydra's multirun needs beyond a single run: the table that ends a sweep (``summary``), its jobs
grouped over seeds and folds (``groups``), a GPU of its own for each job that the ``parallel`` launcher
runs side by side (``gpu_slots``), and Optuna's pruning of a trial (``pruning``).

It may import ``runtime/``; never the example (network, module, data module) or ``trained/``.
"""
