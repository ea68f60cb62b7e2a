"""What a run is told, checked: the framework's schema of each entry point, the user's classes'
signatures (keys checked against their own arguments, before torch loads), the one-line errors of bad
input, what differs between Hydra's versions, and the resolvers conf/ uses.

It imports ``run/`` alone of the machinery.
"""

from mnistlab.runtime.config import resolvers  # noqa: F401  # conf/ names them: registered before any compose
