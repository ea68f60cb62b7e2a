"""The machinery of one run, by concern, each subpackage importing only those before it here: ``run/``
(what every part asks of one run: its folder's names, who started this process, failures, files written
whole, the console, who may start in its folder), ``config/`` (what a run is told, checked),
``distributed/`` (how its processes meet), ``data/`` (data sets served to the ranks, evaluation counting
each sample once), ``checkpointing/`` (checkpoints whole or not at all, read as data, resume), ``reporting/`` (config tree, pictures, hyperparameters, trackers, run record) and
``training/`` (the loop's callbacks: best metric, stop signals, schedule horizon, batch hooks).

It imports nothing else of this package: the example (network, module, data module) and the other
subpackages build on it, never the other way round.
"""
