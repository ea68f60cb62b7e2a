"""Uses of a trained model: its network rebuilt from a checkpoint as data (``loading``), digits prepared
and classified (``digits``, ``prediction``), the network exported for other runtimes (``exporting``).

It may import ``runtime/``; never the example's code (network, module, data module) directly: a
checkpoint names its classes, and ``loading`` builds them once they pass its checks.
"""
