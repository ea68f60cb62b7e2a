"""What a run leaves on disk, whole or not at all: who may start in its folder (claimed by ``run/``,
locked against a second start), checkpoints written atomically and read as data, their checks before
torch reads them, and resume.

It imports ``run/`` and ``config/`` of the machinery.
"""
