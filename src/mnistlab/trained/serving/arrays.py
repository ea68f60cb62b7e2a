"""Inputs sent as NumPy arrays (``.npy`` bodies, ``decode=npy``): the server's input for any data, one
input of the network per request item, as it is before normalisation."""

import io

import numpy as np

from mnistlab.runtime.run.failures import InputError


def decode(body: bytes, max_values: int) -> np.ndarray:
    """A ``.npy`` file's bytes -> the array, as float32. Read with ``allow_pickle=False``: a body is data
    from anyone, and an object array would be unpickled (run code)."""
    try:
        array = np.load(io.BytesIO(body), allow_pickle=False)
    except (ValueError, OSError, EOFError) as err:
        raise InputError(f"the body is not a .npy array of numbers (np.save): {err}") from None
    if not isinstance(array, np.ndarray) or array.dtype.kind not in "biuf":
        raise InputError("the body is not a .npy array of numbers (np.save)")
    if array.size > max_values:
        raise InputError(f"the array has {array.size:,} values, over max_values={max_values:,} (a config value)")
    return array.astype(np.float32)
