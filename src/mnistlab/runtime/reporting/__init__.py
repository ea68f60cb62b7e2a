"""What a run tells: its console and logs, its config as a tree, its failures in one line, test
pictures, hyperparameters, trackers (MLflow, W&B), the profiler, its record of code and data.
"""
