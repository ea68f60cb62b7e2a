"""The machinery of one run: how it is launched (processes, ranks, folders), saved (checkpoints,
atomic result files), stopped (signals, divergence, a silent rank), resumed and reported (console,
config tree, test pictures), and how batches reach the model (in-memory data, batch hooks).

It imports nothing else of this package: the example (network, module, data module) and the other
subpackages build on it, never the other way round.
"""
