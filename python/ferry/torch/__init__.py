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

CUDA tensors go through ferry's store on their device (``ferry._cuda``, in a build made
where the CUDA toolkit is: ``ferry.has_cuda``); CPU tensors through the same store on the
CPU model of ferry's device runtime (``ferry._core``), with host memory in the device's
place, so that every test runs without a GPU. Gradients are bit for bit those of the same
step without offload.
"""

from __future__ import annotations

import collections
import contextlib
import itertools
import os
import threading
import weakref
from typing import Any, Dict, Optional, Tuple, Union

import torch

import ferry
from ferry import _core
from ferry.torch._checks import memory_order as _memory_order
from ferry.torch._checks import device_of, file_path, own_file, whole
from ferry.torch._slab_grad import SlabGradient, clip_grad_norm_
from ferry.torch.layers import StreamedLayers, stream_layers
from ferry.torch.optim import OffloadAdamW

__all__ = ["offload_activations", "keep_on_device", "OffloadAdamW", "stream_layers", "StreamedLayers", "SlabGradient",
           "clip_grad_norm_"]

_KEEP_ATTR = "_ferry_keep_on_device"
# What the store's codecs are called, and the dtypes they take (others are stored exactly).
_CODECS = {None: "none", "bf16": "bf16", "fp8": "fp8"}
_ELEMENTS = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}
# Dtypes a tensor crosses into the extension as (DLPack), with no byte view made first;
# any other (float8, complex, quantized: not every torch exports them) crosses as uint8.
_AS_IS = frozenset({torch.float32, torch.bfloat16, torch.float16, torch.float64, torch.int64, torch.int32,
                    torch.int16, torch.int8, torch.uint8, torch.bool})
# The order of a contiguous tensor's dimensions in memory, by their number (made once for
# the usual numbers; `_identity`).
_IDENTITY = tuple(tuple(range(n)) for n in range(65))


def _identity(n: int) -> Tuple[int, ...]:
    return _IDENTITY[n] if n < len(_IDENTITY) else tuple(range(n))


def keep_on_device(tensor: torch.Tensor) -> torch.Tensor:
    """Marks ``tensor`` so that ``offload_activations`` never offloads it (when autograd
    saves this tensor object); returns it, so it can wrap an expression."""
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"keep_on_device takes a torch.Tensor, not {type(tensor).__name__}")
    setattr(tensor, _KEEP_ATTR, True)
    return tensor


def _inplace_error(t: torch.Tensor, saved_version: int) -> RuntimeError:
    return RuntimeError(
        "one of the variables needed for gradient computation has been modified by an inplace operation: "
        f"[ferry.torch: a tensor of shape {tuple(t.shape)} and dtype {t.dtype} saved at version "
        f"{saved_version} is now at version {t._version}] (autograd's own check is off under saved-tensor "
        "hooks; offload_activations makes it)"
    )


class _Kept:
    """A saved tensor left where autograd saved it, with its version at the save, so
    that an in-place change before the backward pass is refused as autograd refuses it
    (saved-tensor hooks turn autograd's own check off)."""

    __slots__ = ("tensor", "version")

    def __init__(self, t: torch.Tensor) -> None:
        self.tensor = t
        self.version = t._version

    def get(self) -> torch.Tensor:
        if self.tensor._version != self.version:
            raise _inplace_error(self.tensor, self.version)
        return self.tensor


class _Saved:
    """One offloaded tensor: its key in the store and what it takes to rebuild it (shape,
    dtype, and the order of its dimensions in memory, so a dense tensor of any layout,
    channels_last included, comes back with its strides). The graph node that saved it
    holds this object, and this object the cache (so dropping the
    ``offload_activations`` object loses nothing a graph still needs); the bytes come
    back on the first unpack (kept for later unpacks, as ``retain_graph`` needs) and the
    key is erased then, or when the graph is freed without a backward pass. A weak
    reference to the saved tensor checks, at unpack, that it was not changed in place
    after the save."""

    __slots__ = ("_owner", "key", "store", "nbytes", "shape", "dtype", "device", "stream", "order", "version",
                 "source", "ident", "ref", "_value", "_got", "__weakref__")

    def __init__(self, owner: "offload_activations", t: torch.Tensor, order: Tuple[int, ...],
                 ident: Tuple[Any, ...]) -> None:
        self._owner = owner  # the cache lives while a graph still needs its bytes
        self.key: Optional[int] = None
        self.store: Any = None  # the store holding the key, once offloaded
        self.nbytes = t.nbytes
        self.shape = t.shape
        self.dtype = t.dtype
        self.device = t.device
        # CUDA: the stream current at the save (the producer's); the offload, which may run
        # at a later save under another stream, is ordered after this one's work.
        self.stream = torch.cuda.current_stream(self.device) if t.is_cuda else None
        self.order = order  # dims from outermost to innermost in memory
        self.version = t._version
        self.source = weakref.ref(t)
        # What identifies the saved bytes (the owner's table of live saves), and this
        # object's entry there (a weak reference: the graph holds the object, not the table).
        self.ident = ident
        self.ref = weakref.ref(self)
        # Pending (one of the last ``keep_last`` saves, not offloaded yet): the tensor
        # itself, with no key; offloaded: None; fetched: the tensor brought back.
        self._value: Optional[torch.Tensor] = t
        self._got = False

    def get(self) -> torch.Tensor:
        source = self.source()
        if source is not None and source._version != self.version:
            raise _inplace_error(source, self.version)
        self._got = True
        if self._value is None:
            identity = self.order == _identity(len(self.order))
            if identity and self.dtype in _AS_IS:  # the common case: one allocation, no view
                self._value = torch.empty(self.shape, dtype=self.dtype, device=self.device)
                self._owner._fetch(self.store, self.key, self._value)
                return self._value
            raw = torch.empty(self.nbytes, dtype=torch.uint8, device=self.device)
            self._owner._fetch(self.store, self.key, raw)
            if identity:
                self._value = raw.view(self.dtype).view(self.shape)
            else:
                dense = raw.view(self.dtype).view([self.shape[d] for d in self.order])
                inverse = [0] * len(self.order)
                for i, d in enumerate(self.order):
                    inverse[d] = i
                self._value = dense.permute(inverse)
        return self._value

    def __del__(self) -> None:
        self._owner._forget(self)


def _default_device(device: Optional[Union[torch.device, str, int]]) -> torch.device:
    """``device`` checked (``_checks.device_of``); None: the current CUDA device where this
    build has CUDA and one is there, else the CPU."""
    if device is None:
        if ferry.has_cuda and ferry.cuda_device_count() > 0 and torch.cuda.is_available():
            return torch.device("cuda", torch.cuda.current_device())
        return torch.device("cpu")
    return device_of("offload_activations", device)


def _is_parameter(t: torch.Tensor) -> bool:
    # A parameter is a leaf (torch makes it so), and a leaf that requires grad counts as one.
    return t.is_leaf and (t.requires_grad or (type(t) is not torch.Tensor and isinstance(t, torch.nn.Parameter)))


class offload_activations:
    """A context manager that offloads the tensors autograd saves inside it to ferry's
    ``tensor_cache`` and brings them back for the backward pass.

    Make one object and enter it around the forward pass of every step: its pinned
    memory and its record of the first step are reused by the later ones (entering it
    again ends the previous step: ``tensor_cache::end_iteration``).

    Which tensors go: those of at least ``min_bytes`` bytes that are not parameters nor
    views of one (``nn.Parameter``, frozen ones too, leaves that require grad, and the
    ``w.t()`` a linear layer saves: they stay alive anyway), on the CPU or on a CUDA device
    (a CUDA tensor in a build without ``ferry._cuda`` stays: ``kept["device"]``), dense in
    some layout (contiguous, channels_last, transposed) and not marked with
    :func:`keep_on_device`. The others are saved as autograd saves them, each counted by
    reason in ``stats()["kept"]``. A tensor saved several times (one activation read by
    three projections) is offloaded once. The last ``keep_last`` saves of a step are not
    offloaded (the backward pass reads them first; ``kept["last"]``). A tensor the pinned
    memory cannot hold (``pinned_bytes``) stays as autograd saved it
    (``kept["no_room"]``), so a step never fails for want of room. A saved tensor changed
    in place before the backward pass is refused at unpack with autograd's own message
    (saved-tensor hooks turn autograd's check off; this object makes it).

    Args:
        min_bytes: tensors smaller than this stay (offloading them costs more than it frees).
        keep_last: the step's last N saves are not offloaded.
        pinned_bytes: the pinned pool's budget in bytes; 0: ``FERRY_PINNED_BUDGET_BYTES``
            (half of RAM by default).
        prefetch_bytes: device bytes that prefetched tensors may hold at once.
        codec: how offloaded floating tensors travel and wait in pinned memory. ``None``:
            as they are (gradients bit for bit). ``"bf16"``: float32 tensors as bfloat16
            (half the bytes; round to nearest even, |error| <= 2^-8 |x|). ``"fp8"``:
            float32, bfloat16 and float16 tensors as FP8 E4M3 with one float32 scale per
            128 elements (``scale = 448 / amax`` of the block; about a quarter of float32's
            bytes). Other dtypes (integers, bools, what a codec does not take), tensors kept
            resident (``keep_last``, ``min_bytes``) and parameters are always exact.
        nvme_path: a new file or an empty one (made where missing, removed when the
            store goes; a non-empty file is refused, not a folder) for a third tier: when the
            pinned pool is full, tensors spill there (the cache's eviction picks which)
            and are read back for the backward pass, instead of staying where autograd
            saved them. O_DIRECT where the file system allows it, io_uring where the
            kernel allows it (ferry's NVMe tier). None: two tiers.
        nvme_bytes: the NVMe tier's capacity in bytes (> 0 with ``nvme_path``).
        device: the device whose tensors the object takes first: its store (device
            memory, the pinned pool, the NVMe file) is made here, so that a bad argument
            fails at once. None: the current CUDA device where this build has CUDA and a
            device is there, else the CPU (on a GPU machine, pass ``device="cpu"`` for CPU
            tensors: the CUDA store makes a CUDA context). Tensors of another device get a
            store of their own at their first save, with the same budgets (each store's
            own: ``pinned_bytes`` is per device) and without the NVMe tier, which is the
            first store's.

        device_bytes: the most bytes of offloaded tensors whose D2H copy has not yet read
            them (they wait in ferry's device memory meanwhile) before the saving stream
            is held back, on the device, until the link has drained the excess; 0: no
            bound (the forward pass runs ahead of the link as far as it likes, and ferry's
            device memory holds what the link has not drained). Per device.

    Streams (CUDA): each store copies on a stream of its own. A saved tensor is copied
    after the work enqueued on the stream current when it was saved, and that stream
    waits for the copy before it goes on, so the memory torch frees behind it is not
    reused too early; a tensor comes back ready for the stream current at the unpack.
    Nothing is issued on the caller's streams but event waits, and the host never waits
    for a copy: no ``record_stream``, no synchronisation. As for any op, a tensor must be
    saved under the stream that made it (or one ordered after it).

    Raises:
        ValueError: for an argument that is not an integer in [0, 2**63) (Python, numpy
            and torch integers are taken), a codec other than None, "bf16", "fp8", or
            only one of nvme_path and nvme_bytes.
        OSError: when the NVMe file cannot be opened or sized (``errno`` is the file
            system's: EISDIR for a folder, EACCES, ENOSPC; the message names the path).
    """

    def __init__(
        self,
        *,
        min_bytes: int = 1 << 20,
        keep_last: int = 1,
        pinned_bytes: int = 0,
        prefetch_bytes: int = 1 << 30,
        codec: Optional[str] = None,
        nvme_path: Optional[Union[str, "os.PathLike[str]"]] = None,
        nvme_bytes: int = 0,
        device: Optional[Union[torch.device, str, int]] = None,
        device_bytes: int = 0,
    ) -> None:
        if codec not in _CODECS:
            raise ValueError(f"offload_activations: codec must be None, 'bf16' or 'fp8', not {codec!r}")
        checked = {}
        for name, value in (
            ("min_bytes", min_bytes),
            ("keep_last", keep_last),
            ("pinned_bytes", pinned_bytes),
            ("prefetch_bytes", prefetch_bytes),
            ("nvme_bytes", nvme_bytes),
            ("device_bytes", device_bytes),
        ):
            checked[name] = whole(f"offload_activations: {name}", value)
        min_bytes, keep_last = checked["min_bytes"], checked["keep_last"]
        pinned_bytes, prefetch_bytes = checked["pinned_bytes"], checked["prefetch_bytes"]
        path = file_path("offload_activations: nvme_path", nvme_path)
        if (path == "") != (checked["nvme_bytes"] == 0):
            raise ValueError(
                "offload_activations: an NVMe tier needs nvme_path and nvme_bytes > 0 together "
                f"[nvme_path = {nvme_path!r}, nvme_bytes = {checked['nvme_bytes']}]"
            )
        self.min_bytes = min_bytes
        self._keep_last = keep_last
        self._pending: "collections.deque[weakref.ref[_Saved]]" = collections.deque()
        self._settings = dict(
            resident_below_bytes=min_bytes,
            keep_last=0,  # the last saves are kept here, across the store's caches
            pinned_budget_bytes=pinned_bytes,
            prefetch_budget_bytes=prefetch_bytes,
            codec=_CODECS[codec],
            device_bytes=checked["device_bytes"],
        )
        self._nvme_path = path
        self._nvme_bytes = checked["nvme_bytes"]
        # One store per device, the first (``device``) made now with the NVMe file itself.
        self._stores: Dict[torch.device, Any] = {}
        # CUDA tensors go to ferry only where it sees a device (a driver older than its
        # CUDA runtime, while torch's works: they stay, counted in kept["device"])
        self._cuda_usable = ferry.has_cuda and ferry.cuda_device_count() > 0
        self.device = _default_device(device)
        self._store_for(self.device)
        self.codec = codec
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
            "marked": 0,
            "device": 0,
            "parameter": 0,
            "small": 0,
            "not_dense": 0,
            "no_room": 0,
            "last": 0,
        }
        self._deduplicated = 0
        # Tensors saved more than once (one activation read by the q, k and v projections)
        # are offloaded once: the live _Saved of each, by what identifies its bytes.
        self._live: "Dict[tuple, weakref.ref[_Saved]]" = {}

    # --- the context manager ----------------------------------------------------------

    def __enter__(self) -> "offload_activations":
        if self._hooks is not None:
            raise RuntimeError(
                "offload_activations: already entered, on this thread or another (it is not reentrant; "
                "saved-tensor hooks are per thread: use one object per thread)"
            )
        if self._steps > 0:
            with self._lock:
                for store in self._stores.values():
                    store.end_iteration()
        self._steps += 1
        self._position = 0
        hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack)
        hooks.__enter__()
        self._hooks = hooks
        return self

    def __exit__(self, *exc: Any) -> bool:
        with self._lock:  # the step's last saves stay where autograd saved them
            self._kept["last"] += sum(1 for r in self._pending if r() is not None)
            self._pending.clear()
        hooks, self._hooks = self._hooks, None
        if hooks is not None:
            hooks.__exit__(*exc)
        return False

    # --- what autograd calls ----------------------------------------------------------

    def _why_kept(self, t: torch.Tensor) -> Tuple[Optional[str], Optional[Tuple[int, ...]]]:
        """Why `t` stays where autograd saved it (None: it is offloaded), and the order of
        its dimensions in memory. The checks are attribute reads, cheapest first where
        the order of the reasons allows (a save pays for them all)."""
        if getattr(t, _KEEP_ATTR, False):
            return "marked", None
        if not t.is_cpu and not (t.is_cuda and self._cuda_usable):
            return "device", None
        if _is_parameter(t):
            return "parameter", None  # weights and views of them (w.t()), frozen ones too: they stay alive anyway
        base = t._base
        if base is not None and _is_parameter(base):
            return "parameter", None
        strided = t.layout == torch.strided  # (`nbytes` raises for a sparse COO tensor)
        if (t.nbytes if strided else t.numel() * t.element_size()) < max(self.min_bytes, 1):
            return "small", None
        if not strided:
            return "not_dense", None
        if t.is_contiguous():  # the common case, without a sort
            return None, _identity(t.dim())
        order = _memory_order(t)
        if order is None:
            return "not_dense", None
        return None, order

    def _pack(self, t: torch.Tensor) -> Any:
        reason, order = self._why_kept(t)
        if reason is not None:
            self._kept[reason] += 1
            return _Kept(t)
        ident = (t.data_ptr(), t.shape, t.stride(), t.dtype, t._version)
        with self._lock:
            ref = self._live.get(ident)
            earlier = ref() if ref is not None else None
            if earlier is not None and earlier.source() is t:
                self._deduplicated += 1
                return earlier
            # The last ``keep_last`` saves stay pending (as autograd saved them); each save
            # offloads the one ``keep_last`` saves before it, whatever codec takes it.
            saved = _Saved(self, t, order, ident)
            self._live[ident] = saved.ref
            self._pending.append(saved.ref)
            while len(self._pending) > self._keep_last:
                self._offload(self._pending.popleft())
        return saved

    def _offload(self, ref: "weakref.ref[_Saved]") -> None:
        """Offloads a pending save (under the lock); one freed or unpacked since stays."""
        saved = ref()
        if saved is None or saved._got or saved._value is None:
            return
        t = saved._value
        # Conjugate and negative views hold their values with a bit on the side: resolve
        # them, so that the bytes are the values (on CUDA, on the stream that saved it).
        dense = t.detach()
        if dense.is_conj() or dense.is_neg():
            with torch.cuda.stream(saved.stream) if saved.stream is not None else contextlib.nullcontext():
                dense = dense.resolve_conj().resolve_neg()
        identity = saved.order == _identity(len(saved.order))
        if not identity:
            dense = dense.permute(saved.order)
        if not identity or t.dtype not in _AS_IS:
            dense = dense.reshape(-1).view(torch.uint8)  # any dtype, as bytes
        try:
            store = self._store_for(saved.device)
        except MemoryError:
            self._kept["no_room"] += 1
            return
        key = self._position
        self._position += 1
        if store.contains(key):
            key = next(self._spare_keys)
        element = _ELEMENTS.get(t.dtype, "bytes")
        try:
            if saved.stream is None:
                store.offload(key, dense, element)
            else:
                store.offload(key, dense, element, saved.stream.cuda_stream)
        except MemoryError:
            self._kept["no_room"] += 1  # nothing stored; the tensor stays as autograd saved it
            return
        saved.key = key
        saved.store = store
        saved._value = None

    @staticmethod
    def _unpack(saved: Any) -> torch.Tensor:
        return saved.get()

    def _store_for(self, device: torch.device) -> Any:
        """The store of ``device``'s tensors, made on first use (under the lock). Only the
        first (``device``'s, made at construction) has the NVMe tier: a file is never made
        or touched behind the caller's back in the middle of a forward pass."""
        store = self._stores.get(device)
        if store is not None:
            return store
        path = self._nvme_path if not self._stores else ""
        if device.type == "cuda":
            index = device.index if device.index is not None else torch.cuda.current_device()
            store = ferry._cuda.ActivationStore(device=index, nvme_path=path, nvme_bytes=self._nvme_bytes if path else 0,
                                                **self._settings)
        else:
            store = _core.ActivationStore(nvme_path=path, nvme_bytes=self._nvme_bytes if path else 0, **self._settings)
        if path:
            own_file(path)  # removed at exit if the store is alive then (saved tensors of a graph hold it)
        self._stores[device] = store
        return store

    def _fetch(self, store: Any, key: int, out: torch.Tensor) -> None:
        with self._lock:
            if out.is_cuda:
                store.fetch(key, out, torch.cuda.current_stream(out.device).cuda_stream)
            else:
                store.fetch(key, out)

    def _forget(self, saved: _Saved) -> None:
        """A save's object is being freed: its entry in the table of live saves goes, and
        its bytes when they were offloaded and never fetched (a graph freed without its
        backward pass)."""
        with self._lock:
            if self._live.get(saved.ident) is saved.ref:
                del self._live[saved.ident]
            if saved._value is None and saved.store is not None:
                saved.store.discard(saved.key)

    # --- what the user reads ----------------------------------------------------------

    def stats(self) -> Dict[str, Any]:
        """The cache's counters (``stored``, ``offloaded``, ``offloaded_bytes``,
        ``fetched``, ``fetched_bytes``, ``prefetched``, ``kept_resident``), the tensors
        held now (``held``), the steps entered (``steps``), the saves of a tensor already
        offloaded that shared its copy (``deduplicated``), and the tensors left as
        autograd saved them, by reason (``kept``: marked, device, parameter, small,
        not_dense, no_room, last); the NVMe tier's (``nvme``: whether there is one, ``spilled``,
        ``spilled_bytes``, ``read_back``); ``codec``, and the tensors stored through it (``encoded``)
        with their bytes before it (``encoded_bytes``; ``offloaded_bytes`` counts the
        bytes after it); with ``device_bytes``, the offloads after which the saving stream
        was held back (``throttled``) and the bytes still counted as waiting for the link
        (``in_flight_bytes``). Counters are summed over the devices' stores; ``devices``
        names the devices that have one."""
        with self._lock:
            per_store = [dict(store.stats()) for store in self._stores.values()]
        s: Dict[str, Any] = {}
        for one in per_store:
            for name, value in one.items():
                if isinstance(value, bool):  # "nvme": whether any store has the tier
                    s[name] = s.get(name, False) or value
                elif isinstance(value, int):
                    s[name] = s.get(name, 0) + value
                else:  # "codec": the same in every store
                    s[name] = value
        s["devices"] = [str(d) for d in self._stores]
        s["steps"] = self._steps
        s["kept"] = dict(self._kept)
        s["deduplicated"] = self._deduplicated
        return s
