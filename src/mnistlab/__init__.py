"""An MNIST classifier trained with Lightning and configured with Hydra.

What you replace sits here, at the top: ``network.py`` (the ``nn.Module``), ``module.py`` (the
``LightningModule``) and ``data.py`` (the ``LightningDataModule``), with any module of your own; their
config keys are checked against their own arguments (``runtime/config/signatures.py``), so no schema is kept for
them. ``tasks.py`` tells what one run does. The subpackages hold what you should not need to open:
``runtime/`` runs, saves, stops and reports a run; ``sweeps/`` serves Hydra's multirun; ``trained/`` uses
a trained model. The arrows point down only: the top may import any subpackage, and no subpackage
imports the top, so a network, module or data module of your own replaces the example without touching them.
"""
