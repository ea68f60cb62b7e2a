"""What the training loop does besides the model's steps: the best value of the monitored metric,
stop signals and divergence (saved at a step every rank agrees on), the schedule's horizon, batch hooks,
the weights' moving average (averaging).

It may import any other subpackage of the machinery: it is the top of ``runtime/``.
"""
