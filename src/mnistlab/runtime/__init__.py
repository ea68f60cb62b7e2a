"""The machinery of one run, by concern: ``config/`` (what a run is told, checked), ``distributed/`` (its
processes and their shards of each batch), ``checkpointing/`` (its folder and checkpoints, whole or not at
all, and resume), ``training/`` (the loop's callbacks: best metric, stop signals, schedule horizon, batch
hooks) and ``reporting/`` (console, failures, pictures, hyperparameters, trackers, run record).

It imports nothing else of this package: the example (network, module, data module) and the other
subpackages build on it, never the other way round.
"""
