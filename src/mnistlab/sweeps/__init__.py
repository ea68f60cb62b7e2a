"""What Hydra's multirun needs beyond a single run: its jobs read back from their folders (``jobs``),
the table that ends a sweep (``summary``), its jobs grouped over seeds and folds (``groups``), the figure
that compares them (``comparison``, also for any runs: compare.py), a GPU of its own for each job that the ``parallel`` launcher
runs side by side (``gpu_slots``), and Optuna's pruning of a trial (``pruning``).

It may import ``runtime/``; never the example (network, module, data module) or ``trained/``.
"""
