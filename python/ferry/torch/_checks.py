"""Argument and layout checks shared by ferry.torch's objects."""

import operator
import os
from typing import Any, Optional, Tuple

import torch


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


def file_path(what: str, value: Any) -> str:
    """`value` (None, a str or an os.PathLike of str) as a str, "" for None; a TypeError
    naming `what` otherwise (bytes paths included)."""
    if value is None:
        return ""
    try:
        path = os.fspath(value)
    except TypeError:
        path = None
    if not isinstance(path, str):
        raise TypeError(f"{what} must be a str or os.PathLike of str, not {value!r}")
    return path


def memory_order(t: torch.Tensor) -> Optional[Tuple[int, ...]]:
    """The order of `t`'s dimensions in memory (outermost first) when `t` is dense and
    non-overlapping in some order (contiguous, channels_last, a transposed contiguous
    tensor: its elements fill exactly `numel` places), else None."""
    if t.is_contiguous():  # the common case, without a sort and a view
        return tuple(range(t.dim()))
    order = tuple(sorted(range(t.dim()), key=lambda d: (-t.stride(d), -t.size(d))))
    if t.permute(order).is_contiguous():
        return order
    return None
