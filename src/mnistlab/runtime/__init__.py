"""The machinery of one run: how its config is checked (the framework's schema, the user's classes'
signatures), how it is launched (processes, ranks, folders), saved (checkpoints, atomic result files),
stopped (signals, divergence, a silent rank), resumed and reported (console, config tree, test pictures,
the best of the monitored metric), and how batches reach the model (in-memory data, batch hooks).

It imports nothing else of this package: the example (network, module, data module) and the other
subpackages build on it, never the other way round.
"""
