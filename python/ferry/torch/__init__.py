"""ferry.torch: ferry's offloading pipelines for PyTorch.

``offload_activations`` offloads the tensors autograd saves for the backward pass through
ferry's ``tensor_cache`` (pinned memory reused across steps, the first step recorded and
replayed for prefetch), from the saved-tensor hooks of ``torch.autograd.graph``::

    import ferry.torch

    offload = ferry.torch.offload_activations(min_bytes=1 << 20)
    for x, y in batches:
        with offload:                     # saved tensors go to ferry while the forward runs
            loss = loss_fn(model(x), y)
        loss.backward()                   # ... and come back as the backward pass needs them
        optimizer.step()
        optimizer.zero_grad()

This build runs on CPU tensors, through the CPU model of ferry's device runtime
(``ferry.has_cuda`` is False): the same cache code a GPU runs, with host memory in the
device's place. Gradients are bit for bit those of the same step without offload.
"""

from __future__ import annotations

import itertools
import threading
from typing import Any, Dict, Optional

import torch

from ferry import _core

__all__ = ["offload_activations", "keep_on_device"]

_KEEP_ATTR = "_ferry_keep_on_device"


def keep_on_device(tensor: torch.Tensor) -> torch.Tensor:
    """Marks ``tensor`` so that ``offload_activations`` never offloads it (when autograd
    saves this tensor object); returns it, so it can wrap an expression."""
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"keep_on_device takes a torch.Tensor, not {type(tensor).__name__}")
    setattr(tensor, _KEEP_ATTR, True)
    return tensor


class _Saved:
    """One offloaded tensor: its key in the store and what it takes to rebuild it. The
    graph node that saved it holds this object, and this object the cache (so dropping
    the ``offload_activations`` object loses nothing a graph still needs); the bytes come
    back on the first unpack (kept for later unpacks, as ``retain_graph`` needs) and the
    key is erased then, or when the graph is freed without a backward pass."""

    __slots__ = ("_owner", "key", "nbytes", "shape", "dtype", "_value", "__weakref__")

    def __init__(self, owner: "offload_activations", key: int, t: torch.Tensor) -> None:
        self._owner = owner  # the cache lives while a graph still needs its bytes
        self.key = key
        self.nbytes = t.numel() * t.element_size()
        self.shape = t.shape
        self.dtype = t.dtype
        self._value: Optional[torch.Tensor] = None

    def get(self) -> torch.Tensor:
        if self._value is None:
            raw = torch.empty(self.nbytes, dtype=torch.uint8)
            self._owner._fetch(self.key, raw)
            self._value = raw.view(self.dtype).view(self.shape)
        return self._value

    def __del__(self) -> None:
        if self._value is None:
            self._owner._discard(self.key)


class offload_activations:
    """A context manager that offloads the tensors autograd saves inside it to ferry's
    ``tensor_cache`` and brings them back for the backward pass.

    Make one object and enter it around the forward pass of every step: its pinned
    memory and its record of the first step are reused by the later ones (entering it
    again ends the previous step: ``tensor_cache::end_iteration``).

    Which tensors go: those of at least ``min_bytes`` bytes that are on the CPU (this
    build), contiguous, not parameters (leaves that require grad) and not marked with
    :func:`keep_on_device`. The others are saved as autograd saves them, each counted by
    reason in ``stats()["kept"]``. The last ``keep_last`` tensors stored stay in the
    cache's device memory (the backward pass reads them first). A tensor the pinned
    memory cannot hold (``pinned_bytes``) stays as autograd saved it (``kept["no_room"]``),
    so a step never fails for want of room.

    Args:
        min_bytes: tensors smaller than this stay (offloading them costs more than it frees).
        keep_last: the last N tensors stored are not copied out.
        pinned_bytes: the pinned pool's budget in bytes; 0: ``FERRY_PINNED_BUDGET_BYTES``
            (half of RAM by default).
        prefetch_bytes: device bytes that prefetched tensors may hold at once.

    Raises:
        ValueError: for a negative or non-integer argument.
    """

    def __init__(
        self,
        *,
        min_bytes: int = 1 << 20,
        keep_last: int = 1,
        pinned_bytes: int = 0,
        prefetch_bytes: int = 1 << 30,
    ) -> None:
        for name, value in (
            ("min_bytes", min_bytes),
            ("keep_last", keep_last),
            ("pinned_bytes", pinned_bytes),
            ("prefetch_bytes", prefetch_bytes),
        ):
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"offload_activations: {name} must be an integer >= 0, not {value!r}")
        self.min_bytes = min_bytes
        self._store = _core.ActivationStore(
            resident_below_bytes=min_bytes,
            keep_last=keep_last,
            pinned_budget_bytes=pinned_bytes,
            prefetch_budget_bytes=prefetch_bytes,
        )
        # Autograd's threads and the GC (a graph freed without its backward pass) call in
        # too; reentrant, since a collection may run a discard on a thread inside a call.
        self._lock = threading.RLock()
        # Keys are positions within a step, so that the cache's record of the first step
        # names the same tensors in every later one (its prefetch and eviction replay it);
        # a position still held by an earlier step's graph takes a key of its own.
        self._position = 0
        self._spare_keys = itertools.count(1 << 62)
        self._hooks: Optional[Any] = None
        self._steps = 0
        self._kept: Dict[str, int] = {
            "small": 0,
            "marked": 0,
            "parameter": 0,
            "not_contiguous": 0,
            "device": 0,
            "no_room": 0,
        }

    # --- the context manager ----------------------------------------------------------

    def __enter__(self) -> "offload_activations":
        if self._hooks is not None:
            raise RuntimeError("offload_activations: already entered (it is not reentrant)")
        if self._steps > 0:
            with self._lock:
                self._store.end_iteration()
        self._steps += 1
        self._position = 0
        hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack)
        hooks.__enter__()
        self._hooks = hooks
        return self

    def __exit__(self, *exc: Any) -> bool:
        hooks, self._hooks = self._hooks, None
        if hooks is not None:
            hooks.__exit__(*exc)
        return False

    # --- what autograd calls ----------------------------------------------------------

    def _why_kept(self, t: torch.Tensor) -> Optional[str]:
        if getattr(t, _KEEP_ATTR, False):
            return "marked"
        if t.device.type != "cpu":
            return "device"
        if t.numel() * t.element_size() < max(self.min_bytes, 1):
            return "small"
        if t.requires_grad and t.is_leaf:
            return "parameter"
        if not t.is_contiguous():
            return "not_contiguous"
        return None

    def _pack(self, t: torch.Tensor) -> Any:
        reason = self._why_kept(t)
        if reason is not None:
            self._kept[reason] += 1
            return t
        key = self._position
        self._position += 1
        with self._lock:
            if self._store.contains(key):
                key = next(self._spare_keys)
        saved = _Saved(self, key, t)
        flat = t.detach().reshape(-1).view(torch.uint8)  # any dtype, as bytes
        try:
            with self._lock:
                self._store.offload(key, flat)
        except MemoryError:
            saved._value = t  # nothing stored; the tensor stays as autograd saved it
            self._kept["no_room"] += 1
            return t
        return saved

    @staticmethod
    def _unpack(saved: Any) -> torch.Tensor:
        if isinstance(saved, torch.Tensor):
            return saved
        return saved.get()

    def _fetch(self, key: int, raw: torch.Tensor) -> None:
        with self._lock:
            self._store.fetch(key, raw)

    def _discard(self, key: int) -> None:
        with self._lock:
            self._store.discard(key)

    # --- what the user reads ----------------------------------------------------------

    def stats(self) -> Dict[str, Any]:
        """The cache's counters (``stored``, ``offloaded``, ``offloaded_bytes``,
        ``fetched``, ``fetched_bytes``, ``prefetched``, ``kept_resident``), the tensors
        held now (``held``), the steps entered (``steps``), and the tensors left as
        autograd saved them, by reason (``kept``: small, marked, parameter,
        not_contiguous, device, no_room)."""
        with self._lock:
            s = dict(self._store.stats())
        s["steps"] = self._steps
        s["kept"] = dict(self._kept)
        return s
