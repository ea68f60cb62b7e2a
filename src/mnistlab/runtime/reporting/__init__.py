"""What a run tells besides its console (``run/console.py``): its config as a tree, test pictures,
hyperparameters, trackers (MLflow, W&B), the profiler, its record of code and data.

It imports ``run/``, ``config/``, ``distributed/`` and ``checkpointing/`` of the machinery.
"""
