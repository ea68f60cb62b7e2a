"""What every part of the machinery asks about one run, each answered in one module: its folder and the
names of what it holds (``run_folder``), who may start in it (``folder_lock``: one process at a
time), who started this process (``launch``), how it fails
(``failures``: the error types and their one-line formats; ``reported``: how a failure reaches the user),
files written whole (``atomic``), what reaches the console (``console``), and the frameworks' private
parts it relies on (``internals``).

It imports nothing else of this package: the bottom of the one-way graph of ``runtime/``.
"""
