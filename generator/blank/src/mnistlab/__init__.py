"""A project trained with Lightning and configured with Hydra.

What you replace sits here, at the top: ``network.py`` (the ``nn.Module``), ``module.py`` (the
``LightningModule``) and ``data.py`` (the ``LightningDataModule``; a placeholder for now), with any module
of your own; their config keys are checked against their own arguments. ``tasks.py`` tells what one run does. The subpackages hold what you
should not need to open: ``runtime/`` runs, saves, stops and reports a run; ``sweeps/`` serves Hydra's
multirun; ``trained/`` uses a trained model. The arrows point down only: the top may import any
subpackage, and no subpackage imports the top.
"""
