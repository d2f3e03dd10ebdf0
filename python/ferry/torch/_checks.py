"""Argument checks shared by ferry.torch's objects."""

import operator
from typing import Any


def whole(what: str, value: Any) -> int:
    """`value` as an int in [0, 2**63): Python, numpy and torch integers (not bools); a
    ValueError naming `what` otherwise."""
    if isinstance(value, bool):
        raise ValueError(f"{what} must be an integer >= 0, not {value!r}")
    try:
        n = operator.index(value)
    except TypeError:
        raise ValueError(f"{what} must be an integer >= 0, not {value!r}") from None
    if not 0 <= n < 1 << 63:
        raise ValueError(f"{what} must be an integer in [0, 2**63), not {n}")
    return n
