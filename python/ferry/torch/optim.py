"""``OffloadAdamW``: ``torch.optim.AdamW`` with its states in ferry's pinned pool or on NVMe,
stepped by ferry's vectorised, multi-threaded CPU AdamW (``ferry::basic_adamw``)."""

from __future__ import annotations

import itertools
import math
import numbers
import os
import threading
import warnings
import weakref
from typing import Any, Callable, Dict, Iterable, List, Optional, Tuple, Union

import torch

from ferry import _core
from ferry.torch._checks import file_path, own_file, whole
from ferry.torch._slab_grad import SlabGradient

__all__ = ["OffloadAdamW"]

# The dtype names NvmeStates.step takes for a parameter stepped through its master.
_LOW = {torch.bfloat16: "bfloat16", torch.float16: "float16"}


def _describe(t: torch.Tensor) -> str:
    return f"shape = {tuple(t.shape)}, dtype = {t.dtype}, device = {t.device}"


class _Staging:
    """The host side of CUDA parameters: per parameter a copy of it and of its gradient
    in pinned memory (torch's pinned allocator, made at its first step and reused by every
    later one: 8 bytes per element), and per device two copy streams of its own, one for
    each direction.

    A step makes both copy streams wait for the work enqueued so far on the device's
    current stream (which produced the gradients, and any clipping), pulls every parameter
    and gradient D2H on the pull stream, one event per parameter; the CPU steps each
    parameter as soon as its event has completed, while the later ones are still crossing,
    and pushes it back H2D on the push stream, so the two directions overlap; the current
    stream then waits for both streams (the host does not). Nothing is allocated on the
    copy streams and no memory of the current stream is freed behind them, so no
    ``record_stream`` is needed. A pinned copy is written by the next step's pull only
    after this step's push has read it: the pull stream waits for the current stream, which
    waited for the push stream."""

    def __init__(self) -> None:
        self._buffers: Dict[int, Tuple["weakref.ref[torch.Tensor]", torch.Tensor, torch.Tensor]] = {}
        self._streams: Dict[torch.device, Tuple[Any, Any]] = {}

    def host(self, p: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        """The pinned copies of ``p`` and its gradient (flat, in ``p``'s dtype: float32, or
        bfloat16 / float16 for a parameter with a master copy), made on first use.

        Raises:
            MemoryError: the pinned memory cannot be had (naming the bytes).
        """
        entry = self._buffers.get(id(p))
        if entry is None or entry[0]() is not p or entry[1].dtype != p.dtype:
            for key in [k for k, (ref, _, _) in self._buffers.items() if ref() is None]:
                del self._buffers[key]  # parameters gone since
            n = p.numel()
            try:
                entry = (weakref.ref(p), torch.empty(n, dtype=p.dtype, pin_memory=True),
                         torch.empty(n, dtype=p.dtype, pin_memory=True))
            except RuntimeError as e:  # torch's pinned allocator out of memory
                raise MemoryError(
                    f"OffloadAdamW: the pinned copies of a CUDA parameter ({n * p.element_size() * 2} bytes) cannot be "
                    f"had [{_describe(p)}]: {e}"
                ) from e
            self._buffers[id(p)] = entry
        return entry[1], entry[2]

    def streams(self, device: torch.device) -> Tuple[Any, Any]:
        """The pull (D2H) and push (H2D) streams of ``device``."""
        s = self._streams.get(device)
        if s is None:
            s = self._streams[device] = (torch.cuda.Stream(device), torch.cuda.Stream(device))
        return s

    def begin(self, devices: Iterable[torch.device]) -> None:
        """Both copy streams of each device wait for its current stream's work so far."""
        for device in set(devices):
            current = torch.cuda.current_stream(device)
            for s in self.streams(device):
                s.wait_stream(current)

    def pull(self, params: List[torch.Tensor]) -> List[Any]:
        """D2H of each parameter and its gradient into its pinned copies (after ``begin``);
        returns an event per parameter."""
        events = []
        for p in params:
            hp, hg = self.host(p)
            pull = self.streams(p.device)[0]
            with torch.cuda.stream(pull):
                hp.view(p.shape).copy_(p.detach(), non_blocking=True)
                hg.view(p.shape).copy_(p.grad.detach(), non_blocking=True)  # a strided gradient too
                e = torch.cuda.Event()
                e.record(pull)
            events.append(e)
        return events

    def push(self, p: torch.Tensor) -> None:
        """H2D of ``p``'s pinned copy into ``p`` on the push stream."""
        hp, _ = self.host(p)
        with torch.cuda.stream(self.streams(p.device)[1]):
            p.detach().view(-1).copy_(hp, non_blocking=True)

    def finish(self, devices: Iterable[torch.device]) -> None:
        """Each device's current stream waits for both copy streams."""
        for device in set(devices):
            current = torch.cuda.current_stream(device)
            for s in self.streams(device):
                current.wait_stream(s)


class OffloadAdamW(torch.optim.Optimizer):
    """AdamW whose two moments per parameter live in a ferry ``pinned_pool`` (pinned host
    memory, never on the device) and whose update runs on the CPU in ferry's AdamW kernel
    (AVX-512, AVX2 or portable, on ``threads`` threads), in place on the parameters.

    A ``torch.optim.Optimizer``: param groups, ``torch.optim.lr_scheduler``, gradient
    clipping before ``step`` (``torch.nn.utils.clip_grad_norm_``), ``zero_grad``,
    ``state_dict`` / ``load_state_dict`` (the same keys as ``torch.optim.AdamW``:
    ``step``, ``exp_avg``, ``exp_avg_sq``, so a checkpoint moves between the two; a loaded
    state is copied into the pool, and a run resumed from it continues bit for bit).

    The update is ``torch.optim.AdamW``'s (decoupled weight decay, bias corrections) with
    PyTorch's constants computed from the same Python floats
    (``ferry::adamw_constants::from_double``). The moments come out bit for bit those of
    ``torch.optim.AdamW(foreach=False)`` on a CPU whose PyTorch kernels fuse the
    multiply-adds (AVX2, AVX-512: ``fused_rounding=True``, the default); the parameters
    within 1 ulp per step, because PyTorch's vectorised CPU ``sqrt`` is not correctly
    rounded for about one element in six while ferry's is (docs/python.md).

    With ``nvme_path``, the states live in a file there instead (ZeRO-Infinity's optimizer
    offload, for one process: ``ferry::state_swapper`` over a ``ferry::nvme_tier``): per
    parameter, in param-group order, its two moments (8 bytes per element, twice: the new
    states go to the copy that is not current, so a failed write never touches the good
    one; float32 parameters are their own master weights, so no master copy is kept; with
    a bfloat16 or float16 parameter among them, every parameter's copies hold a float32
    master array too, 12 bytes per element, twice; a float32 parameter's is stale, NaN, so
    that one made 16-bit later gets a new master from itself, as in pinned memory). The
    parameters that fit ``pinned_bytes`` stay in pinned memory and are stepped in place;
    the others are
    streamed through three pinned buffers: the next parameter's states read and the last
    one's written while the current one is stepped. ``state_dict`` reads the moments from
    the file; ``opt.state[p]`` holds ``step`` only. See ``nvme_path`` below and
    docs/python.md.

    Parameters are float32, bfloat16 or float16 and contiguous, on the CPU or on CUDA
    devices; gradients may be strided (they are read through a contiguous copy then). A
    bfloat16 or float16 parameter gets a float32 master copy in the pool (``state["master"]``,
    4 bytes per element; saved and loaded with the moments, so a resumed run goes on bit
    for bit): the step updates the master from the gradient widened to float32, and the
    parameter becomes the master rounded to its dtype (to nearest even, as ``Tensor.to``
    rounds). Each step compares the parameter with the master rounded to its dtype: where
    they differ (the parameter was changed since, in any way: in place, through ``.data``,
    a new ``.data``, a checkpoint of the model loaded), the master is re-seeded from the
    parameter; where they agree, the master, not the rounded parameter, is what the step
    starts from (mixed-precision training's master weights). A parameter converted to
    float32 since is its own master again. With ``nvme_path`` the master lives in the file
    beside the moments and is stepped the same way (the parameter compared with it
    rounded, re-seeded where they differ): a run with its states on NVMe goes on bit for
    bit as one with them in pinned memory. A CUDA parameter is stepped on
    the CPU too (ZeRO-Offload's optimizer step): at each ``step`` it and its gradient are
    copied D2H into pinned copies of them (8 bytes per element of pinned memory beyond
    ``pinned_bytes``, made at its first step and reused), on a pull stream of ferry's
    after the work enqueued on the device's current stream (so clipping before ``step``
    is seen); the CPU steps each parameter as soon as its copies have landed, while the
    next ones cross, and copies it back H2D on a push stream while it steps the next (the
    two directions overlap); the current stream then waits for both (the host does not). The moments stay
    on the host, so ``state_dict`` holds CPU tensors (``torch.optim.AdamW`` moves them to
    the parameter's device when it loads them). A CUDA parameter's values are read from
    the device at every step, so a change to it between steps is seen. ``step`` and
    ``load_state_dict`` are all or nothing: every check and allocation comes before any
    change. A trainable weight of ``stream_layers(nvme_path=...)`` (a ``meta`` parameter
    whose ``.grad`` is a ``SlabGradient``) is stepped through its stack after the others, a
    layer at a time: the layer read from the file, each parameter stepped from its
    gradient slab, the layer written back; an ``OSError`` there leaves the layers before it
    stepped, and the next ``step`` finishes the step, as with ``nvme_path`` below
    (docs/python.md, "Weights on NVMe").
    A copy (``copy.deepcopy``, ``pickle``) gets a pool of its own. Like
    ``torch.optim.AdamW``, one optimizer is stepped from one thread at a time.

    Args:
        params: parameters or param groups, as for any ``torch.optim.Optimizer``.
        lr, betas, eps, weight_decay: as ``torch.optim.AdamW`` (same defaults; Python,
            numpy and 0-dim torch numbers; ``eps`` must be > 0).
        pinned_bytes: the budget of the pool the moments live in; 0:
            ``FERRY_PINNED_BUDGET_BYTES`` (half of RAM by default). Each moment costs its
            bytes (4 per element) rounded up to 256; the pool takes memory in slabs of
            16 MiB, and a moment larger than that in a slab of its own size rounded up to
            the page; the budget is rounded down to the page. So a budget of 8 bytes per
            element plus 512 bytes per parameter plus 16 MiB always holds the moments.
        threads: CPU threads of the update; 0: ``FERRY_OPTIMIZER_THREADS`` (the hardware
            threads, at most 16).
        fused_rounding: round the moments' multiply-adds as fused (PyTorch's AVX2 /
            AVX-512 kernels) or each operation on its own (its scalar code).
        nvme_path: a new file or an empty one (made where missing, locked while the
            optimizer lives, removed when it goes; a non-empty file is refused with
            ``FileExistsError``, a folder with ``OSError``) to keep the states in. A relative
            path is made absolute at construction. With it, ``pinned_bytes``
            is the host memory of the states (0: the same default): the ring of three
            buffers of the largest parameter spilled (24 bytes per element) plus the
            parameters kept resident (8 bytes per element, in order while they fit);
            beside it, ordinary memory for an undo copy of the last three parameters
            stepped from the file (12 bytes per element of the largest). A step stopped by
            an ``OSError`` leaves every parameter with its states (stepped and written, or
            as before the step); the next ``step`` call finishes that step, stepping only
            the parameters it had not, while the gradients are those it saw (after a new
            backward pass or ``zero_grad`` it steps every parameter with a gradient
            instead, with a ``RuntimeWarning``: the failed step's rest went without its
            update). Such an optimizer cannot be copied or pickled (its
            file is its own): save ``state_dict()``.
        nvme_bytes: the file's capacity in bytes (> 0 with ``nvme_path``): at least 16
            bytes per element of every parameter, each of its four arrays (two, twice)
            rounded up to 4 KiB (24 bytes per element and six arrays with a bfloat16 or
            float16 parameter among them), checked at the first ``step`` (``MemoryError`` with both
            figures) even while ``pinned_bytes`` holds every state. A param group added after the first step moves the states to a new
            layout at the next ``step``: the file and the pinned memory hold both layouts
            meanwhile (a ``MemoryError`` when they cannot leaves the states where they
            were, readable by ``state_dict``). A step that raised is finished by the next
            call even across an ``add_param_group`` (the new parameters take their first
            step in it).

    Raises:
        ValueError: a hyper-parameter out of range (naming it), ``amsgrad`` or
            ``maximize`` (not supported), a parameter that is not float32, bfloat16 or
            float16, strided, contiguous and on the CPU or a CUDA device (naming its shape,
            dtype and device).
        MemoryError: at a ``step`` whose new moments do not fit in the pool (nothing is
            updated; the step can be called again once there is room); with
            ``nvme_path``, at the first ``step`` when the file's capacity or the host
            memory cannot hold the states (naming the bytes).
        OSError: with ``nvme_path``, a path that cannot be made or locked (a folder, no
            permission, a file another optimizer holds), and an I/O error in ``step``,
            ``state_dict`` or ``load_state_dict`` (errno and the call, path and offset).
    """

    def __init__(
        self,
        params: Iterable[Any],
        lr: float = 1e-3,
        betas: Tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 1e-2,
        *,
        amsgrad: bool = False,
        maximize: bool = False,
        pinned_bytes: int = 0,
        threads: int = 0,
        fused_rounding: bool = True,
        nvme_path: Optional[Union[str, "os.PathLike[str]"]] = None,
        nvme_bytes: int = 0,
    ) -> None:
        if amsgrad or maximize:
            raise ValueError("OffloadAdamW: amsgrad and maximize are not supported (ferry's AdamW has neither)")
        _hyper(lr, betas, eps, weight_decay)
        path = file_path("OffloadAdamW: nvme_path", nvme_path)
        size = whole("OffloadAdamW: nvme_bytes", nvme_bytes)
        if (path == "") != (size == 0):
            raise ValueError(
                "OffloadAdamW: states on NVMe need nvme_path and nvme_bytes > 0 together "
                f"[nvme_path = {nvme_path!r}, nvme_bytes = {size}]"
            )
        self._settings = {
            "pinned_bytes": whole("OffloadAdamW: pinned_bytes", pinned_bytes),
            "threads": whole("OffloadAdamW: threads", threads),
            "fused_rounding": bool(fused_rounding),
            "nvme_path": path,
            "nvme_bytes": size,
        }
        self._nvme = None
        defaults = dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay)
        super().__init__(params, defaults)  # each group through add_param_group: checked
        self._make_engine()

    def _make_engine(self) -> None:
        self._adamw = _core.AdamW(self._settings["threads"], self._settings["fused_rounding"])
        self._pool = None
        self._nvme = None
        self._layout: List[torch.Tensor] = []  # the parameters of the NVMe groups, in order
        self._broken: Optional[str] = None  # a load_state_dict that failed part way
        # ids of the parameters a step that raised had stepped (None: no such step): the
        # next step call finishes that step without them
        self._unfinished: Optional[set] = None
        # the gradients the step that raised saw: (parameter, gradient, its mark); a step
        # that finds others (a new backward pass since) does not finish it but starts anew
        self._unfinished_grads: List[Tuple[torch.Tensor, Any, Any]] = []
        self._stepping = threading.Lock()
        self._staging = _Staging()
        if self._settings.get("nvme_path"):
            # OSError: a folder, no permission, a file another optimizer holds
            self._nvme = _core.NvmeStates(
                self._settings["nvme_path"], self._settings["nvme_bytes"], self._settings["pinned_bytes"]
            )
            own_file(self._settings["nvme_path"])  # removed at exit if the optimizer is alive then
        else:
            self._pool = _core.StatePool(self._settings["pinned_bytes"])

    @property
    def state_bytes(self) -> int:
        """Host bytes the states hold now: the pool's blocks in use, or with ``nvme_path``
        the pinned memory of the ring and the resident parameters (0 before the first
        ``step``)."""
        if self._nvme is not None:
            return int(self._nvme.stats()["host_bytes"])
        return self._pool.used

    @property
    def nvme_stats(self) -> Optional[Dict[str, Any]]:
        """With ``nvme_path``: the states' figures (``groups``, ``resident_groups``,
        ``spilled_groups``, ``ring_bytes``, ``host_bytes``, ``undo_bytes``,
        ``bytes_per_element`` (8: the two moments; 12 with master arrays), ``keep_master``
        (whether the copies hold master arrays: a bfloat16 or float16 parameter),
        ``capacity_bytes``, ``file_bytes_used``, ``engine``, ``direct_io``, ``steps``,
        ``failed_steps``, ``reads``, ``writes``, ``bytes_read``, ``bytes_written``,
        ``pending``); None without."""
        if self._nvme is None:
            return None
        stats = dict(self._nvme.stats())
        stats["pending"] = self._unfinished is not None
        return stats

    @property
    def threads(self) -> int:
        """Threads of the update."""
        return self._adamw.threads

    @property
    def isa(self) -> str:
        """The kernel the update runs (``avx512``, ``avx2`` or ``portable``)."""
        return self._adamw.isa

    def add_param_group(self, param_group: Dict[str, Any]) -> None:
        """As ``torch.optim.Optimizer.add_param_group``, with this optimizer's checks: a
        group with a hyper-parameter out of range or a parameter it cannot step is refused
        (``ValueError``) and not added."""
        super().add_param_group(param_group)
        group = self.param_groups[-1]
        try:
            _group_hyper(group)
            for p in group["params"]:
                if p.is_meta and (not p.requires_grad or _on_file(p)):
                    # a parameter without values (stream_layers(nvme_path=...)): a frozen one is never
                    # stepped, a trainable one through its stack's file (checked at its step)
                    continue
                _check_param(p)
            if self._settings.get("nvme_path") and len({id(p) for p in group["params"]}) != len(group["params"]):
                raise ValueError(
                    "OffloadAdamW: a parameter appears twice in one group (torch steps it twice; the states on "
                    "NVMe hold one copy of each parameter's states)"
                )
        except Exception:
            self.param_groups.pop()
            raise

    def _moment(self, p: torch.Tensor) -> torch.Tensor:
        if p.numel() == 0 or self._pool is None:  # nothing to hold; or a loaded moment on its way to the file
            return torch.zeros(p.shape, dtype=torch.float32)
        return self._pool.zeros(p.numel()).view(p.shape)

    @torch.no_grad()
    def step(self, closure: Optional[Callable[[], float]] = None) -> Optional[float]:
        """One AdamW step over every parameter that has a gradient. All or nothing: every
        group and gradient is checked and every missing moment allocated before any
        parameter changes, so an error (``ValueError``, ``MemoryError``) leaves every
        parameter and state as it was, and the step can be called again."""
        if not self._stepping.acquire(blocking=False):
            raise RuntimeError("OffloadAdamW.step: called while another thread steps this optimizer (one at a time)")
        try:
            return self._step(closure)
        finally:
            self._stepping.release()

    def _step(self, closure: Optional[Callable[[], float]]) -> Optional[float]:
        if self._nvme is not None:
            self._check_usable("step")
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        work = []
        for group in self.param_groups:
            hp = _group_hyper(group)
            for p in group["params"]:
                if p.grad is None:
                    continue
                grad = p.grad
                if isinstance(grad, SlabGradient):
                    _check_file_param(p, grad)
                    work.append((p, hp))
                    continue
                if grad.is_sparse:
                    raise ValueError(f"OffloadAdamW: sparse gradients are not supported [{_describe(p)}]")
                _check_param(p)
                if grad.dtype != p.dtype or grad.device != p.device or grad.shape != p.shape:
                    raise ValueError(
                        f"OffloadAdamW: a gradient unlike its parameter [param: {_describe(p)}; grad: {_describe(grad)}]"
                    )
                work.append((p, hp))
        seen = [(p, p.grad, _grad_mark(p.grad)) for p, _ in work]
        self._drop_stale_unfinished(seen)
        try:
            if self._nvme is not None:
                self._step_nvme(work)
            else:
                self._step_pinned(work)
        finally:
            self._unfinished_grads = seen if self._unfinished is not None else []
        return loss

    def _drop_stale_unfinished(self, seen: List[Tuple[torch.Tensor, Any, Any]]) -> None:
        """A step that raised is finished by the next ``step`` only while the gradients are
        those it saw; after a new backward pass (or ``zero_grad``) it is dropped, with a
        RuntimeWarning, and this step steps every parameter with a gradient."""
        if self._unfinished is None:
            return
        before = {id(p): (g, mark) for p, g, mark in self._unfinished_grads}
        now = {id(p): (g, mark) for p, g, mark in seen}
        # (a parameter with a gradient that the failed step did not see, one of a group
        # added since, takes its first step in the finishing one)
        same = all(k in now and now[k][0] is before[k][0] and now[k][1] == before[k][1] for k in before)
        if not same:
            warnings.warn(
                "OffloadAdamW.step: the step that raised before was not finished (call step() again before the next "
                "backward pass to finish it), and the gradients changed since; this step steps every parameter "
                "with a gradient, and the parameters the failed step had not reached went without its update",
                RuntimeWarning,
                stacklevel=4,
            )
            self._unfinished = None

    def _step_pinned(self, work: List[Tuple[torch.Tensor, Tuple[float, ...]]]) -> None:
        finished = self._unfinished or set()  # stepped by a step that raised: not again
        work = [(p, hp) for p, hp in work if id(p) not in finished]
        on_file = [(p, hp) for p, hp in work if isinstance(p.grad, SlabGradient)]
        work = [(p, hp) for p, hp in work if not isinstance(p.grad, SlabGradient)]
        on_device = [p for p, _ in work if p.device.type == "cuda" and p.numel() > 0]
        for p in on_device:
            self._staging.host(p)  # every pinned copy made before any state (MemoryError: nothing changed)
        created = []
        try:
            for p, _ in work + on_file:
                # A weight on NVMe (meta) gets a master of zeros: its first step re-seeds the
                # master from the parameter wherever they differ (every element but +0.0).
                seed = (lambda m, p=p: m) if p.is_meta else (lambda m, p=p: m.copy_(p.detach()))  # widened: exact
                if not self.state.get(p):
                    m = self._moment(p)  # MemoryError: the moments made by this call go again
                    v = self._moment(p)
                    st = {"step": torch.tensor(0.0), "exp_avg": m, "exp_avg_sq": v}
                    if p.dtype != torch.float32:
                        st["master"] = seed(self._moment(p))
                    self.state[p] = st
                    created.append(p)
                elif p.dtype != torch.float32 and "master" not in self.state[p]:  # e.g. a torch AdamW state loaded
                    self.state[p]["master"] = seed(self._moment(p))
        except BaseException:
            for p in created:
                del self.state[p]
            raise
        for p, _ in work + on_file:
            if p.dtype == torch.float32:
                self.state[p].pop("master", None)  # a parameter made float32 since (model.float()) is its own master
        self._staging.begin(p.device for p in on_device)
        try:
            landed = dict(zip(map(id, on_device), self._staging.pull(on_device)))
            for p, (lr, beta1, beta2, eps, wd) in work:
                state = self.state[p]
                step = int(state["step"].item()) + 1
                if p.numel() > 0:
                    event = landed.get(id(p))
                    master = state.get("master")
                    if event is not None:
                        event.synchronize()  # its D2H copies have landed
                        param, grad = self._staging.host(p)
                    else:
                        param, grad = p.detach().view(-1), p.grad.detach()
                        if grad.untyped_storage().data_ptr() == p.untyped_storage().data_ptr():
                            grad = grad.clone()  # a gradient sharing its parameter's memory (p.grad = p.detach())
                        grad = grad.contiguous().view(-1)
                    hyper = dict(lr=lr, beta1=beta1, beta2=beta2, eps=eps, weight_decay=wd, step=step)
                    if master is None:
                        self._adamw.step(param, grad, state["exp_avg"].view(-1), state["exp_avg_sq"].view(-1), **hyper)
                    else:
                        # One call: the master re-seeded from the parameter (on the host) where
                        # the parameter is not the master rounded (bits, not values: a NaN
                        # equals no value, and would re-seed it at every step), stepped with the
                        # gradient widened, and rounded to nearest even into the parameter (or
                        # its pinned copy). Loops of ferry's, without the four temporaries of
                        # the same passes as torch ops (docs/benchmarks.md).
                        self._adamw.step_low(_LOW[p.dtype], param.view(torch.int16), grad.view(torch.int16),
                                             master.view(-1), state["exp_avg"].view(-1),
                                             state["exp_avg_sq"].view(-1), **hyper)
                    if event is not None:
                        self._staging.push(p)  # H2D while the CPU steps the next
                state["step"].fill_(float(step))
        finally:
            self._staging.finish(p.device for p in on_device)
        stepped = finished | {id(p) for p, _ in work}
        try:
            for stack, i, items in _by_layer(on_file):
                with stack._pass_lock:  # no pass begins while the layer is read, stepped and written
                    raw, old, views, grads = stack._slab_step(i)  # OSError: this layer and the rest not stepped
                    for p, k, (lr, beta1, beta2, eps, wd) in items:
                        state = self.state[p]
                        step = int(state["step"].item()) + 1
                        hyper = dict(lr=lr, beta1=beta1, beta2=beta2, eps=eps, weight_decay=wd, step=step)
                        param, grad = views[k].view(-1), grads[k].view(-1)
                        if p.dtype == torch.float32:
                            self._adamw.step(param, grad, state["exp_avg"].view(-1), state["exp_avg_sq"].view(-1),
                                             **hyper)
                        else:
                            self._adamw.step_low(_LOW[p.dtype], param.view(torch.int16), grad.view(torch.int16),
                                                 state["master"].view(-1), state["exp_avg"].view(-1),
                                                 state["exp_avg_sq"].view(-1), **hyper)
                        state["step"].fill_(float(step))
                        stepped.add(id(p))
                    stack._write_stepped(i, raw, old)  # OSError: kept in host memory, written later (stepped)
        except BaseException:
            if on_file:
                self._unfinished = stepped
                for p in created:  # a first step that did not happen leaves no state
                    if id(p) not in stepped:
                        del self.state[p]
            raise
        self._unfinished = None

    def _check_usable(self, what: str) -> None:
        if self._broken is not None:
            raise RuntimeError(
                f"OffloadAdamW.{what}: the states on NVMe are incomplete since {self._broken}; "
                "load_state_dict again (the state dict it was given is unchanged)"
            )

    def _ensure_layout(self) -> Dict[int, int]:
        """The NVMe groups for the parameters of the param groups now (a group added since
        the last layout gets a new swapper; the states move over: the file and the pinned
        memory hold both layouts meanwhile); {id(p): group}. Raises MemoryError (nothing
        changed) when they do not fit."""
        order = [p for group in self.param_groups for p in group["params"] if not p.is_meta or _on_file(p)]
        # Master arrays while any parameter is bfloat16 or float16 (one converted since, by
        # model.bfloat16() or model.float(), makes a new layout too).
        keep = any(p.dtype != torch.float32 for p in order)
        if [id(p) for p in order] != [id(p) for p in self._layout] or (order and keep != self._nvme.keep_master):
            if order:
                old = {id(p): i for i, p in enumerate(self._layout)}
                self._nvme.layout([p.numel() for p in order], [old.get(id(p), -1) for p in order], keep)
            self._layout = order
        return {id(p): i for i, p in enumerate(self._layout)}

    def _step_nvme(self, work: List[Tuple[torch.Tensor, Tuple[float, ...]]]) -> None:
        index = self._ensure_layout()
        if not self._layout:
            return  # no parameters at all (an empty group)
        # Every group holds states before a step: a parameter without a state (never
        # stepped, or dropped by a load) starts from zero moments.
        for g, p in enumerate(self._layout):
            if not self._nvme.initialized(g) or (p.grad is not None and not self.state.get(p)):
                self._nvme.initialize(g)
        finished = self._unfinished or set()  # stepped by a step that raised: not again
        for p, _ in work:
            if p.device.type == "cuda" and p.numel() > 0 and id(p) not in finished:
                self._staging.host(p)  # every pinned copy made before any state (MemoryError: nothing changed)
        entries = []
        planned = {}
        created = []
        empty = []
        on_file: List[Tuple[torch.Tensor, Tuple[float, ...]]] = []
        for p, (lr, beta1, beta2, eps, wd) in work:
            if id(p) in finished:
                continue
            state = self.state.get(p)
            if not state:
                state = self.state[p] = {"step": torch.tensor(0.0)}
                created.append(p)
            step = int(state["step"].item()) + 1
            if p.numel() == 0:
                state["step"].fill_(float(step))  # nothing to hold or step
                empty.append(p)
                continue
            g = index[id(p)]
            planned[g] = (p, state, step)
            if isinstance(p.grad, SlabGradient):
                on_file.append((p, (lr, beta1, beta2, eps, wd)))  # stepped layer by layer, below
                continue
            if p.device.type == "cuda":
                param, grad = self._staging.host(p)  # filled below
            else:
                param, grad = p.detach().view(-1), p.grad.detach()
                if grad.untyped_storage().data_ptr() == p.untyped_storage().data_ptr():
                    grad = grad.clone()
                grad = grad.contiguous().view(-1)
            if p.dtype == torch.float32:
                entries.append((g, param, grad, lr, beta1, beta2, eps, wd, step))
            else:  # stepped through its master in the file; 16-bit elements passed as int16
                entries.append((g, param.view(torch.int16), grad.view(torch.int16), lr, beta1, beta2, eps, wd, step,
                                _LOW[p.dtype]))
        if not entries and not on_file:
            self._unfinished = None
            return
        # CUDA parameters: all pulled before the swapper steps (it pipelines its reads and
        # writes over the whole list), all pushed back after once pulled, whatever happened: a
        # parameter's pinned copy holds its new values or, where the step did not reach
        # it or could not write its states, its values before the step.
        on_device = [planned[g][0] for g, *_ in entries if planned[g][0].device.type == "cuda"]
        done: List[int] = []
        failed = True
        pulled = False
        self._staging.begin(p.device for p in on_device)
        try:
            for event in self._staging.pull(on_device):
                event.synchronize()
            pulled = True  # each pinned copy holds its parameter: pushed back whatever the step does
            if entries:
                try:
                    done = list(self._nvme.step(self._adamw, entries))
                except BaseException:
                    done = list(self._nvme.last_updated)  # the parameters stepped before the error
                    raise
            # The weights on NVMe, a layer at a time: read, its groups stepped (their states
            # read and written by the swapper), written back. A group whose states were not
            # written gets its parameter back in `raw` (the swapper's undo): the layer is
            # written whatever happened, so the file holds each group's parameter as its
            # states are.
            for stack, i, items in _by_layer(on_file):
                with stack._pass_lock:  # no pass begins while the layer is read, stepped and written
                    self._step_file_layer(stack, i, items, index, planned, done)
            failed = False
        finally:
            if pulled:
                for p in on_device:
                    self._staging.push(p)
            self._staging.finish(p.device for p in on_device)
            stepped = {id(p) for p in empty}
            for g in done:
                p, state, step = planned[g]
                state["step"].fill_(float(step))
                stepped.add(id(p))
            for p in created:  # a first step that did not happen leaves no state
                if id(p) not in stepped:
                    del self.state[p]
            self._unfinished = (finished | stepped) if failed else None

    def _step_file_layer(self, stack: Any, i: int, items: List[Any], index: Dict[int, int],
                         planned: Dict[int, Any], done: List[int]) -> None:
        """With the states on NVMe: layer i of ``stack`` (trainable weights on NVMe) read,
        its parameters' groups stepped by the swapper, the layer written back; the groups
        stepped appended to ``done`` (also when it raises)."""
        raw, old, views, grads = stack._slab_step(i)  # OSError: this layer and the rest not stepped
        mine = []
        for p, k, (lr, beta1, beta2, eps, wd) in items:
            g = index[id(p)]
            step = planned[g][2]
            param, grad = views[k].view(-1), grads[k].view(-1)
            if p.dtype == torch.float32:
                mine.append((g, param, grad, lr, beta1, beta2, eps, wd, step))
            else:
                mine.append((g, param.view(torch.int16), grad.view(torch.int16), lr, beta1, beta2, eps, wd,
                             step, _LOW[p.dtype]))
        try:
            done += list(self._nvme.step(self._adamw, mine))
        except BaseException:
            done += list(self._nvme.last_updated)
            if self._nvme.last_updated:
                try:
                    stack._write_stepped(i, raw, old)  # those stepped: their weights as their states
                except OSError:
                    pass  # kept in host memory (written later); the step's own error is raised
            raise
        stack._write_stepped(i, raw, old)  # OSError: kept in host memory, written later (stepped)

    def state_dict(self) -> Dict[str, Any]:
        """As ``torch.optim.Optimizer.state_dict`` (the keys of ``torch.optim.AdamW``: a
        checkpoint moves between the two). With ``nvme_path`` the moments are read from
        the file into new CPU tensors.

        Raises:
            OSError: a read from the file failed.
            RuntimeError: after a ``load_state_dict`` that failed part way.
        """
        sd = super().state_dict()
        if self._nvme is None:
            return sd
        self._check_usable("state_dict")
        index = {id(p): i for i, p in enumerate(self._layout)}  # parameters with states are in it
        params = [p for group in self.param_groups for p in group["params"]]  # torch's numbering
        packed = {}
        for i, st in sd["state"].items():
            p = params[i]
            st = dict(st)
            keys = ("exp_avg", "exp_avg_sq") + (("master",) if p.dtype != torch.float32 else ())
            for key in keys:
                t = torch.zeros(p.numel(), dtype=torch.float32)
                if p.numel() > 0:
                    self._nvme.read(index[id(p)], key, t)
                st[key] = t.view(p.shape)
            packed[i] = st
        sd["state"] = packed
        return sd

    def load_state_dict(self, state_dict: Dict[str, Any]) -> None:
        """As ``torch.optim.Optimizer.load_state_dict`` (a ``torch.optim.AdamW`` state
        loads too), then each loaded moment is copied into the pool (the loaded tensors
        are not kept), so the optimizer goes on exactly where the saved one stopped. All
        or nothing: on an error the optimizer keeps its own state and groups.

        Raises:
            ValueError: a state that is not AdamW's (no ``exp_avg``...), a moment whose
                shape is not its parameter's, a group with ``amsgrad`` or ``maximize`` on,
                a hyper-parameter out of range; the base class's errors (a different number
                of groups or parameters).
            MemoryError: moments that do not fit the pool.
        """
        for i, group in enumerate(state_dict.get("param_groups", [])):
            for flag in ("amsgrad", "maximize"):
                if group.get(flag):
                    raise ValueError(f"OffloadAdamW.load_state_dict: group {i} has {flag} on, which ferry's AdamW lacks")
        for index, st in state_dict.get("state", {}).items():
            missing = sorted({"step", "exp_avg", "exp_avg_sq"} - set(st))
            if missing:
                raise ValueError(
                    f"OffloadAdamW.load_state_dict: the state of parameter {index} lacks {missing} (not an AdamW state)"
                )
        self._check_threads_idle()
        if self._nvme is not None:
            self._ensure_layout()  # MemoryError: nothing changed
        old_state, old_groups = self.state, self.param_groups
        try:
            super().load_state_dict(state_dict)
            # torch's load casts each state to its parameter's dtype and device (a bfloat16
            # parameter's float32 moments and master to bfloat16): read the given tensors.
            saved_ids = itertools.chain.from_iterable(g["params"] for g in state_dict["param_groups"])
            now = itertools.chain.from_iterable(g["params"] for g in self.param_groups)
            given = {id(p): state_dict["state"][i] for i, p in zip(saved_ids, now) if i in state_dict["state"]}
            moments = {}
            for group in self.param_groups:
                _group_hyper(group)
                for p in group["params"]:
                    st = self.state.get(p)
                    if not st:
                        continue
                    st = given.get(id(p), st)
                    fresh = {}
                    for key in ("exp_avg", "exp_avg_sq"):
                        loaded = st[key]
                        if loaded.shape != p.shape:
                            raise ValueError(
                                f"OffloadAdamW.load_state_dict: {key} of shape {tuple(loaded.shape)} for a "
                                f"parameter of shape {tuple(p.shape)}"
                            )
                        fresh[key] = self._moment(p).copy_(loaded.to(dtype=torch.float32, device="cpu"))
                    loaded = st.get("master") if p.dtype != torch.float32 else None
                    if loaded is not None:  # without one, the first step takes the parameter's values
                        if loaded.shape != p.shape:
                            raise ValueError(
                                f"OffloadAdamW.load_state_dict: master of shape {tuple(loaded.shape)} for a "
                                f"parameter of shape {tuple(p.shape)}"
                            )
                        fresh["master"] = self._moment(p).copy_(loaded.to(dtype=torch.float32, device="cpu"))
                    step = st["step"]
                    fresh["step"] = torch.tensor(float(step.item() if isinstance(step, torch.Tensor) else step))
                    moments[p] = fresh
        except BaseException:
            self.state, self.param_groups = old_state, old_groups
            raise
        if self._nvme is not None:
            try:
                self._load_nvme(moments)
            except BaseException:
                self.param_groups = old_groups  # the states are incomplete: _broken says so
                raise
            return
        for p, fresh in moments.items():
            self.state[p] = fresh

    def _check_threads_idle(self) -> None:
        if self._stepping.locked():
            raise RuntimeError("OffloadAdamW: load_state_dict while another thread steps this optimizer")

    def _load_nvme(self, moments: Dict[torch.Tensor, Dict[str, torch.Tensor]]) -> None:
        """Writes loaded moments to the file: each group's states are written to its copy
        that is not current, which becomes current once written."""
        try:
            for g, p in enumerate(self._layout):
                fresh = moments.get(p)
                if fresh is None:
                    self._nvme.initialize(g)
                else:
                    master = fresh.get("master") if self._nvme.keep_master else None
                    self._nvme.initialize(g, fresh["exp_avg"].reshape(-1), fresh["exp_avg_sq"].reshape(-1),
                                          None if master is None else master.reshape(-1))
        except BaseException as e:
            self._broken = f"a load_state_dict that failed part way ({type(e).__name__}: {e})"
            for p in list(self.state):
                self.state[p] = {"step": self.state[p]["step"]} if "step" in self.state[p] else {}
            raise
        self._broken = None
        self._unfinished = None  # a step that raised before the load is not finished
        for p in list(self.state):
            if p not in moments:
                del self.state[p]
        for p, fresh in moments.items():
            self.state[p] = {"step": fresh["step"]}

    def __getstate__(self) -> Dict[str, Any]:
        if self._nvme is not None:
            raise TypeError(
                "OffloadAdamW with nvme_path cannot be copied or pickled: its states are in a file it holds "
                f"({self._settings['nvme_path']!r}). Save state_dict() (torch.save) and load it into an "
                "OffloadAdamW with a path of its own."
            )
        state = super().__getstate__()
        state["_ferry_settings"] = dict(self._settings)
        return state

    def __setstate__(self, state: Dict[str, Any]) -> None:
        """A copy (``copy.deepcopy``, ``pickle``, ``torch.save`` of the optimizer) gets a
        pool of its own, with the moments copied in. (``torch.optim.Optimizer.load_state_dict``
        sets the loaded state and groups through here too: then the optimizer keeps its
        settings, pool and file.)"""
        if "_ferry_settings" not in state and getattr(self, "_settings", None) is not None:
            super().__setstate__(state)
            return
        self._settings = state.pop(
            "_ferry_settings", {"pinned_bytes": 0, "threads": 0, "fused_rounding": True}
        )
        self._settings["nvme_path"] = ""
        self._settings["nvme_bytes"] = 0
        super().__setstate__(state)
        self._make_engine()
        for p, st in list(self.state.items()):
            for key in ("exp_avg", "exp_avg_sq", "master"):
                if key in st and isinstance(st[key], torch.Tensor):
                    st[key] = self._moment(st[key]).copy_(st[key])


def _real(value: Any) -> Optional[float]:
    """`value` as a float: Python, numpy and 0-dim torch numbers (not bools); None otherwise."""
    if isinstance(value, bool):
        return None
    if isinstance(value, torch.Tensor):
        return float(value.item()) if value.numel() == 1 and not value.dtype.is_complex else None
    if isinstance(value, numbers.Real):
        return float(value)
    return None


def _group_hyper(group: Dict[str, Any]) -> Tuple[float, float, float, float, float]:
    """A param group's hyper-parameters, checked, refusing the flags ferry's AdamW lacks
    (a group may carry them whatever the constructor was given)."""
    for flag in ("amsgrad", "maximize"):
        if group.get(flag):
            raise ValueError(f"OffloadAdamW: a param group has {flag} on, which ferry's AdamW lacks")
    return _hyper(group["lr"], group["betas"], group["eps"], group["weight_decay"])


def _hyper(lr: Any, betas: Any, eps: Any, weight_decay: Any) -> Tuple[float, float, float, float, float]:
    """The hyper-parameters as floats (lr, beta1, beta2, eps, weight_decay), checked."""
    flr = _real(lr)
    if flr is None or not 0.0 <= flr < math.inf:
        raise ValueError(f"OffloadAdamW: invalid learning rate: {lr!r} (a finite number >= 0)")
    if not isinstance(betas, (tuple, list)) or len(betas) != 2:
        raise ValueError(f"OffloadAdamW: betas must be a pair, not {betas!r}")
    fb = []
    for i, b in enumerate(betas):
        f = _real(b)
        if f is None or not 0.0 <= f < 1.0:
            raise ValueError(f"OffloadAdamW: invalid beta parameter at index {i}: {b!r} (in [0, 1))")
        fb.append(f)
    feps = _real(eps)
    if feps is None or not 0.0 < feps < math.inf:
        raise ValueError(
            f"OffloadAdamW: invalid epsilon value: {eps!r} (finite and > 0: ferry divides by sqrt(v) + eps, "
            "and v is 0 where a gradient was)"
        )
    fwd = _real(weight_decay)
    if fwd is None or not 0.0 <= fwd < math.inf:
        raise ValueError(f"OffloadAdamW: invalid weight_decay value: {weight_decay!r} (finite, >= 0)")
    return flr, fb[0], fb[1], feps, fwd


def _check_param(p: torch.Tensor) -> None:
    if not isinstance(p, torch.Tensor):
        raise TypeError(f"OffloadAdamW: a parameter must be a torch.Tensor, not {type(p).__name__}")
    if p.layout != torch.strided:
        raise ValueError(f"OffloadAdamW: sparse parameters are not supported [{_describe(p)}, layout = {p.layout}]")
    if p.device.type not in ("cpu", "cuda"):
        raise ValueError(f"OffloadAdamW: parameters must be on the CPU or a CUDA device [{_describe(p)}]")
    _check_elements(p, "")


def _check_elements(p: torch.Tensor, where: str) -> None:
    """A dtype ferry's AdamW steps, and contiguous; ``where`` prefixes the description."""
    if p.dtype not in (torch.float32, torch.bfloat16, torch.float16):
        raise ValueError(
            f"OffloadAdamW: parameters must be float32, bfloat16 or float16 (ferry's AdamW is fp32; the others get "
            f"an fp32 master copy) [{where}{_describe(p)}]"
        )
    if not p.is_contiguous():
        raise ValueError(f"OffloadAdamW: parameters must be contiguous (updated in place) [{where}{_describe(p)}]")


def _on_file(p: torch.Tensor) -> bool:
    """Whether ``p`` is a trainable weight of a ``StreamedLayers`` with its weights on NVMe
    (a ``meta`` parameter stepped through the stack's file)."""
    ref = getattr(p, "_ferry_stack", None)
    stack = ref() if ref is not None else None
    return stack is not None and not stack._frozen


def _check_file_param(p: torch.Tensor, grad: SlabGradient) -> None:
    """A weight on NVMe with its ``SlabGradient``: its stack alive, a dtype ferry's AdamW
    steps, contiguous (stepped in the layer's bytes, with its moments in its order)."""
    if grad.stack() is None:
        raise ValueError(f"OffloadAdamW: the StreamedLayers of {grad._where} is gone; its gradient with it")
    _check_elements(p, f"{grad._where}: ")


def _by_layer(items: List[Tuple[torch.Tensor, Tuple[float, ...]]]) -> List[Tuple[Any, int, List[Any]]]:
    """Weights on NVMe grouped by stack and layer, in order of first appearance:
    (stack, layer, [(parameter, index in the layer, hyper-parameters)])."""
    out: Dict[Tuple[int, int], Tuple[Any, int, List[Any]]] = {}
    for p, hp in items:
        g = p.grad
        stack = g.stack()
        key = (id(stack), g._layer)
        if key not in out:
            out[key] = (stack, g._layer, [])
        out[key][2].append((p, g._index, hp))
    return list(out.values())


def _grad_mark(g: Any) -> Any:
    """What changes when a gradient is written again: a ``SlabGradient``'s stack's count of
    backward passes (its slab is written in place, behind torch), else the tensor's
    version (an accumulation or ``zero_`` bumps it)."""
    if isinstance(g, SlabGradient):
        stack = g.stack()
        return None if stack is None else stack._backwards
    return g._version
