"""Hydra sweeps as Optuna studies (``hydra/sweeper=optuna``, ``hparams_search=mnist_optuna``), on today's
Optuna through its ask-and-tell API, with pruning and studies that survive a killed sweep.

The sweeper asks the study for ``n_jobs`` trials at a time and launches them as one batch through the
configured Hydra launcher (basic, ``parallel``, ``slurm``): each job gets its trial's parameters as
overrides and, at ``trial_key``, the trial's number; the job's pruning callback
(``mnistlab/sweeps/pruning.py``) reports to that trial and may end it as PRUNED. The sweeper then tells
the study each job's result (``optimized_metric``, or FAIL). While a batch runs it records the trials'
heartbeats in the storage: a sweep killed mid-trial leaves a trial whose heartbeat stops, and the next
sweep of the study marks it FAIL and runs its parameters again. Hydra imports every plugin when it
starts: Optuna itself is imported only when a sweep begins.
"""
