"""What a run leaves on disk, whole or not at all: its folder (claimed, locked against a second start),
checkpoints written atomically and read as data, their checks before torch reads them, and resume.
"""
