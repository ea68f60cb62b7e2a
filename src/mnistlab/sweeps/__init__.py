"""What Hydra's multirun needs beyond a single run: the table that ends a sweep (``summary``) and a GPU
of its own for each job that the ``parallel`` launcher runs side by side (``gpu_slots``).

It may import ``runtime/``; never the example (network, module, data module) or ``trained/``.
"""
