"""Argument and layout checks shared by ferry.torch's objects."""

import atexit
import errno
import operator
import os
from typing import Any, Dict, Optional, Tuple

import torch

import ferry


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
    """`value` (None, a str or an os.PathLike of str) as an absolute path ("" for None),
    for a file ferry makes, uses and removes: a TypeError naming `what` for another type
    (bytes paths included), a ValueError for an empty path or one with a NUL, and a
    FileExistsError (EEXIST) for a regular file that is there already and not empty
    (ferry would empty it, then remove it: a leftover of an earlier run is removed by
    hand). Relative paths are made absolute now, so a later ``os.chdir`` does not move
    the file ferry removes."""
    if value is None:
        return ""
    try:
        path = os.fspath(value)
    except TypeError:
        path = None
    if not isinstance(path, str):
        raise TypeError(f"{what} must be a str or os.PathLike of str, not {value!r}")
    if path == "" or "\0" in path:
        raise ValueError(f"{what} must be a non-empty path without NUL characters, not {value!r}")
    path = os.path.abspath(path)
    if os.path.isfile(path) and os.path.getsize(path) > 0:
        raise FileExistsError(
            errno.EEXIST,
            f"{what}: a file of {os.path.getsize(path)} bytes is there already; ferry empties the file it is "
            "given and removes it when done, so it takes a new path or an empty file (remove a leftover of an "
            "earlier run by hand)",
            path,
        )
    return path


# The NVMe files ferry's objects made in this process, by path: (device, inode) of each.
_FILES: Dict[str, Tuple[int, int]] = {}


def own_file(path: str) -> None:
    """Notes that ferry made the file at ``path`` (an NVMe tier's, just opened), so that
    it is removed at the interpreter's exit if it is still there then: an object alive at
    exit (held by an autograd graph, a global ``loss`` after or before ``backward()``)
    may never be destroyed, and its tier would never remove its file."""
    try:
        st = os.stat(path)
    except OSError:
        return
    _FILES[path] = (st.st_dev, st.st_ino)


@atexit.register
def _remove_files() -> None:
    """At exit: each file of ``own_file`` still at its path, the same file (device and
    inode: never a file made there since by someone else), is removed; the tier's open
    descriptor keeps its data until the process ends."""
    for path, ident in list(_FILES.items()):
        try:
            st = os.stat(path)
            if (st.st_dev, st.st_ino) == ident:
                os.unlink(path)
        except OSError:
            pass


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


def device_of(what: str, device: Any) -> torch.device:
    """``device`` (a torch.device, a str or a CUDA index) as the CPU or a CUDA device with
    its index, checked against this build and machine: a ValueError naming ``what`` for
    something that is not a device, a device other than the CPU and CUDA, CUDA in a build
    without ``ferry._cuda`` or where no CUDA device is usable, and an index past the
    devices ferry sees (``torch.device(2**40)`` is taken by torch as ``cuda:0``)."""
    try:
        d = torch.device(device)
    except (RuntimeError, TypeError) as e:
        raise ValueError(f"{what}: device {device!r} is not a device ({e})") from None
    if d.type == "cpu":
        return torch.device("cpu")
    if d.type != "cuda":
        raise ValueError(f"{what}: device {d} is not the CPU or a CUDA device")
    if not ferry.has_cuda:
        raise ValueError(f"{what}: device {d}: this build of ferry has no CUDA module (ferry.has_cuda is False; "
                         "build it where the CUDA toolkit is)")
    count = ferry.cuda_device_count()
    if not torch.cuda.is_available() or count == 0:
        raise ValueError(f"{what}: device {d}: no CUDA device is usable here")
    index = device if isinstance(device, int) else d.index
    if index is not None and not 0 <= index < count:
        raise ValueError(f"{what}: device {device!r}: CUDA device {index} does not exist (ferry sees {count})")
    return torch.device("cuda", index if index is not None else torch.cuda.current_device())
