"""Checkpoints: written whole or not at all (``checkpoint_io``), checked before torch reads them and read
as data (``checkpoint_checks``), the best ones kept (``top_k``), and a run resumed from one (``resume``), and a start refused in a folder whose
last checkpoint another launch wrote (``ownership``).

It imports ``run/`` and ``config/`` of the machinery.
"""
