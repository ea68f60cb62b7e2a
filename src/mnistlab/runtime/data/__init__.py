"""How a data set reaches the processes of a run: held in memory and served a whole batch per indexing
operation, each global batch cut into per-rank shards that resume mid-epoch (``in_memory``); streamed as
LitData chunks from a folder or a bucket, resumable on any number of ranks (``streaming``), written from any
data module by stream.py (``chunks``); and evaluation that counts every sample once on any number of ranks
(``exact_evaluation``).

It imports ``run/`` and ``config/`` of the machinery.
"""
