"""What a run is told, checked: the framework's schema of each entry point, the user's classes'
signatures (keys checked against their own arguments, before torch loads), the one-line errors of bad
input, and what differs between Hydra's versions.
"""
