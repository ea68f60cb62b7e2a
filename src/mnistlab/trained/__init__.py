"""Uses of a trained model: its network rebuilt from a checkpoint as data (``loading``), a model that
answers raw inputs, from a checkpoint or an exported file (``inference``: class probabilities or values),
the network exported for other runtimes (``exporting``, ``model_card``) and served over HTTP (``serving/``).

It may import ``runtime/``; never the example's code (network, module, data module, ``example/``)
directly: a checkpoint names its classes, and ``loading`` builds them once they pass its checks.
"""
