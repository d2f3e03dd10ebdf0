"""Layer streaming for PyTorch: ``stream_layers`` (see its docstring)."""

from __future__ import annotations

import contextlib
import copy
import functools
import threading
import weakref
from typing import Any, Dict, List, Optional, Sequence, Tuple

import torch

import ferry
from ferry import _core
from ferry.torch._checks import device_of, file_path, memory_order, own_file, whole
from ferry.torch._slab_grad import SlabGradient, StackRef

__all__ = ["stream_layers", "StreamedLayers"]

_DTYPES = {torch.float32: "float32", torch.float64: "float64", torch.float16: "float16", torch.bfloat16: "bfloat16"}
_ALIGN = 64  # bytes between parameters in a layer's slab (torch's CPU allocator aligns to 64)


def _same(t: torch.Tensor) -> torch.Tensor:
    return t


def _to_meta(items: Sequence[Tuple[int, str, torch.nn.Parameter]],
             what: str = "stream_layers") -> List[Tuple[torch.nn.Parameter, Any]]:
    """Makes each parameter of ``items`` (layer, name, parameter) a parameter of its shape,
    strides and dtype without values, on ``meta``, in place: the same Python object, its
    attributes kept (``p.data = ...`` cannot change a tensor's device; ``swap_tensors``
    can). All or none: when torch refuses one (a live autograd graph saved it, a weak
    reference, a subclass with ``__slots__``), those done are swapped back and a
    ValueError names it (``what``: who asks). Returns (parameter, holder of its values)
    pairs, for ``_swap_back``."""
    done: List[Tuple[torch.nn.Parameter, Any]] = []
    try:
        for i, name, p in items:
            empty = torch.nn.Parameter(torch.empty_strided(p.shape, p.stride(), dtype=p.dtype, device="meta"),
                                       requires_grad=p.requires_grad)
            empty.__dict__.update(p.__dict__)  # swap_tensors swaps the attributes too: p keeps a copy of its own
            try:
                torch.utils.swap_tensors(p, empty)
            except Exception as e:  # torch's RuntimeError or TypeError
                raise ValueError(
                    f"{what}: parameter {name!r} of layer {i} cannot become a meta tensor in place, as the "
                    f"weights on NVMe need ({type(e).__name__}: {e}); something holds it: an autograd graph that "
                    "saved it (free it first), a weak reference, a Parameter subclass with __slots__. Nothing "
                    "changed"
                ) from None
            done.append((p, empty))
    except BaseException:
        _swap_back(done)
        raise
    return done


def _swap_back(done: List[Tuple[torch.nn.Parameter, Any]]) -> None:
    """Undoes ``_to_meta``: each parameter gets its values (and attributes) back."""
    for p, holder in reversed(done):
        torch.utils.swap_tensors(p, holder)


def _params_of(layer: torch.nn.Module, lay: "_Layout", i: int) -> Dict[str, torch.nn.Parameter]:
    """Layer i's parameters now, by name; a RuntimeError when their names changed since
    ``stream_layers`` (``lay``)."""
    now = dict(layer.named_parameters())
    if list(now) != lay.names:
        raise RuntimeError(
            f"StreamedLayers: layer {i}'s parameters changed names since stream_layers "
            f"({lay.names} -> {list(now)}); stream a new stack"
        )
    return now


def _in(t: torch.Tensor, raw: torch.Tensor) -> bool:
    """Whether `t`'s memory is in `raw`'s (a slot, reused by the next layer)."""
    start = raw.data_ptr()
    return start <= t.untyped_storage().data_ptr() < start + raw.numel()


class _Layout:
    """One layer's parameters: name, parameter, offset in bytes, elements, dtype, shape."""

    def __init__(self, layer: torch.nn.Module, index: int) -> None:
        self.names: List[str] = []
        self.params: List[torch.nn.Parameter] = []
        self.offsets: List[int] = []
        self.strides: List[Optional[Tuple[int, ...]]] = []
        offset = 0
        for name, p in layer.named_parameters():
            if p.dtype not in _DTYPES:
                raise TypeError(
                    f"stream_layers: parameter {name!r} of layer {index} has dtype {p.dtype}; streamed weights "
                    "must be float32, float64, float16 or bfloat16"
                )
            if p.is_sparse or p.layout != torch.strided:
                raise TypeError(f"stream_layers: parameter {name!r} of layer {index} is not a dense tensor")
            if p.numel() == 0:
                raise ValueError(f"stream_layers: parameter {name!r} of layer {index} has no elements")
            offset = -(-offset // _ALIGN) * _ALIGN
            self.names.append(name)
            self.params.append(p)
            self.offsets.append(offset)
            # a dense layout in any order (transposed, channels_last) keeps its strides in
            # the slab, so the layer's kernels see the layout they saw; others go contiguous
            self.strides.append(tuple(p.stride()) if memory_order(p) is not None else None)
            offset += p.numel() * p.element_size()
        if not self.params:
            raise ValueError(f"stream_layers: layer {index} ({type(layer).__name__}) has no parameters to stream")
        self.bytes = offset

    def spec(self) -> List[Tuple[int, int, str]]:
        return [(o, p.numel(), _DTYPES[p.dtype]) for o, p in zip(self.offsets, self.params)]

    def views(self, raw: torch.Tensor) -> List[torch.Tensor]:
        """The parameters' tensors over a layer's bytes `raw` (a slot, a slab)."""
        out = []
        for o, p, st in zip(self.offsets, self.params, self.strides):
            flat = raw[o : o + p.numel() * p.element_size()].view(p.dtype)
            out.append(flat.view(p.shape) if st is None else flat.as_strided(p.shape, st))
        return out


class _Layer(torch.autograd.Function):
    """Layer i of a stack: forward from its slot, saving nothing but its input; backward
    loads it again, recomputes the layer and pushes its weights' gradient out (or, under
    ``torch.autograd.grad``, returns it to autograd). Inputs: the stack's token (every
    layer a node of the graph), ``x``, the extra inputs, then the layer's parameters (so
    that autograd knows them)."""

    @staticmethod
    def forward(ctx: Any, owner: "StreamedLayers", index: int, n_extra: int, token: torch.Tensor, x: torch.Tensor,
                *rest: Any) -> torch.Tensor:
        extra = rest[:n_extra]
        ctx.owner = owner
        ctx.index = index
        ctx.extra = extra
        ctx.n_params = len(rest) - n_extra
        ctx.state = owner._capture_state(index, extra)
        ctx.below = x.grad_fn  # the node of the layer below (None for layer 0's input)
        ctx.save_for_backward(x)
        return owner._run_forward(index, x, extra)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> Any:
        owner = ctx.owner
        try:
            (x,) = ctx.saved_tensors
        except BaseException:
            owner._reset()  # e.g. autograd's in-place check on the saved input: the pass is abandoned
            raise
        gx, gparams = owner._run_backward(ctx.index, x, ctx.extra, ctx.state, grad, ctx.needs_input_grad[4], ctx.below)
        return (None, None, None, None, gx) + (None,) * len(ctx.extra) + tuple(gparams)


class StreamedLayers(torch.nn.Module):
    """A stack of layers whose weights live in ferry's pinned slabs and are streamed into
    ``slots`` device slots as the passes need them (made by ``stream_layers``; see there)."""

    def __init__(self, layers: Sequence[torch.nn.Module], slots: int = 2, gradient_slabs: int = 4,
                 preserve_rng_state: bool = True, device: Any = None, nvme_path: Any = None) -> None:
        super().__init__()
        if isinstance(layers, torch.nn.Module) and not isinstance(layers, (torch.nn.ModuleList, torch.nn.Sequential)):
            raise TypeError("stream_layers takes a sequence of modules (a list, nn.ModuleList or nn.Sequential)")
        layers = list(layers)
        if not layers:
            raise ValueError("stream_layers needs at least one layer")
        for i, layer in enumerate(layers):
            if not isinstance(layer, torch.nn.Module):
                raise TypeError(f"stream_layers: layer {i} is a {type(layer).__name__}, not a torch.nn.Module")
        slots = whole("slots", slots)
        if slots < 1:
            raise ValueError("stream_layers: slots must be at least 1, not 0")
        gradient_slabs = whole("gradient_slabs", gradient_slabs)
        if gradient_slabs < 1:
            raise ValueError("stream_layers: gradient_slabs must be at least 1, not 0")
        path = file_path("stream_layers: nvme_path", nvme_path)
        self.layers = torch.nn.ModuleList(layers)
        self.preserve_rng_state = bool(preserve_rng_state)
        slots = min(slots, len(layers))  # more slots than layers would hold nothing
        self._pass_lock = threading.Lock()  # one pass begins at a time (two threads, one stack)
        self._layouts = [_Layout(layer, i) for i, layer in enumerate(layers)]
        self.device = _slot_device(device, [p for lay in self._layouts for p in lay.params if not p.is_meta])
        owner: Dict[int, Tuple[int, str]] = {}
        for i, lay in enumerate(self._layouts):
            for name, p in zip(lay.names, lay.params):
                if p.is_meta and not path:
                    raise ValueError(
                        f"stream_layers: parameter {name!r} of layer {i} is a meta tensor (no values: a layer built "
                        "on the meta device, or streamed already by a stack with its weights on NVMe); weights in "
                        "pinned memory need values, weights on NVMe (nvme_path=) may be loaded later"
                    )
                if p.device.type not in ("cpu", "meta") and p.device != self.device:
                    raise ValueError(
                        f"stream_layers: parameter {name!r} of layer {i} is on {p.device}; the slots are on "
                        f"{self.device} (a parameter is on the CPU or on the slots' device)"
                    )
                if id(p) in owner:
                    j, other = owner[id(p)]
                    raise ValueError(
                        f"stream_layers: parameter {name!r} of layer {i} is also {other!r} of layer {j}; a streamed "
                        "weight belongs to one layer (tie weights outside the stack)"
                    )
                owner[id(p)] = (i, name)
                held = getattr(p, "_ferry_stack", None)
                if held is not None and held() is not None:
                    raise ValueError(
                        f"stream_layers: parameter {name!r} of layer {i} is streamed already by a StreamedLayers "
                        f"with its weights on NVMe ({held()._nvme_path!r}; the parameter is a meta tensor there): "
                        "stream new layers, with that stack's state_dict() loaded"
                    )
                if path and weakref.getweakrefcount(p):
                    raise ValueError(
                        f"stream_layers: parameter {name!r} of layer {i} has weak references (an optimizer's, a "
                        "hook's?); weights on NVMe make each parameter a meta tensor in place, which torch refuses "
                        "then: stream the layers before making what refers to them"
                    )
        # Weights on NVMe with a parameter that requires grad: the stack keeps gradient slabs
        # in host memory (ZeRO-Infinity's split); without one it is frozen (none).
        trainable = bool(path) and any(p.requires_grad for lay in self._layouts for p in lay.params)
        specs = [lay.spec() for lay in self._layouts]
        if self.device.type == "cuda":
            self._core = ferry._cuda.LayerStack(self.device.index, specs, slots, gradient_slabs, nvme_path=path,
                                                trainable=trainable)
        else:
            self._core = _core.LayerStack(specs, slots, gradient_slabs, nvme_path=path, trainable=trainable)
        self._gradient_slabs = gradient_slabs
        self._nvme = bool(path)
        self._nvme_path = path
        self._frozen = bool(path) and not trainable  # on NVMe without gradient slabs
        # With trainable weights on NVMe: per layer, its parameters' gradients (CPU views of
        # the gradient slab) and the SlabGradients that stand for them as ``.grad``; the new
        # weights of a layer whose write into the file failed after an optimizer step
        # (written before anything else reads the layer).
        self._markers: List[List[Optional[SlabGradient]]] = []
        self._pending: Dict[int, torch.Tensor] = {}
        self._backwards = 0  # backward passes that assigned gradients (a SlabGradient's writes)
        if path:
            own_file(path)  # removed at exit if the stack is alive then (held by a graph)
        self._written = [0] * len(layers)  # per layer, the writes into the file since it was made
        # With the weights on NVMe: per layer, the parameters with no values yet (meta at
        # stream_layers: loaded later), and the parameters' versions when the stack last
        # took them (an in-place change to a meta tensor changes nothing: refused); per
        # thread, the keys a load_state_dict in progress wrote into the file.
        self._unset: List[set] = [set() for _ in layers]
        self._versions: List[List[int]] = []
        self._handled: Dict[int, List[str]] = {}
        self._inside = 0  # > 0 while the stack runs a layer (the layers' own hooks let it)
        self._grads: List[List[torch.Tensor]] = []
        with torch.no_grad():
            if self._nvme:
                # Every layer into the file first, then the parameters let go of their values
                # (they become ``meta`` tensors, all or none): a failure leaves the layers as
                # they were, and the file goes with the core.
                try:
                    for i, lay in enumerate(self._layouts):
                        raw = torch.zeros(self._core.layer_bytes(i), dtype=torch.uint8)
                        for k, (p, w) in enumerate(zip(lay.params, lay.views(raw))):
                            if p.is_meta:
                                self._unset[i].add(k)
                            else:
                                w.copy_(p)
                        self._core.write_weights(i, raw)
                    _to_meta([(i, name, p) for i, lay in enumerate(self._layouts)
                              for name, p in zip(lay.names, lay.params) if not p.is_meta])
                except BaseException:
                    self._close()
                    raise
                self._versions = [[p._version for p in lay.params] for lay in self._layouts]
                for lay in self._layouts:
                    for p in lay.params:
                        p._ferry_stack = StackRef(self)  # its stack: OffloadAdamW steps a trainable one through it
                if trainable:
                    for i, lay in enumerate(self._layouts):
                        self._grads.append(lay.views(self._core.gradient(i)))
                        self._markers.append([None] * len(lay.params))
                for layer in self.layers:
                    layer.register_forward_pre_hook(functools.partial(StreamedLayers._outside_call, weakref.ref(self)))
            else:
                # The weights move into the pinned slabs: each parameter's data becomes a view
                # of its slab, so the optimizer, state_dict and load_state_dict work on them in
                # place.
                for i, lay in enumerate(self._layouts):
                    for p, w in zip(lay.params, lay.views(self._core.weights(i))):
                        w.copy_(p)
                        p.data = w
                    self._grads.append(lay.views(self._core.gradient(i)))
        self._weight_ptr = [[p.data_ptr() for p in lay.params] for lay in self._layouts]
        if self._nvme:
            # state_dict() reads the values from the file; load_state_dict() writes them there.
            self.register_state_dict_post_hook(StreamedLayers._state_dict_from_file)
            self.register_load_state_dict_pre_hook(StreamedLayers._load_into_file)
            self.register_load_state_dict_post_hook(StreamedLayers._after_load)
        self._got: List[List[bool]] = [[False] * len(lay.params) for lay in self._layouts]
        self._token = torch.zeros((), requires_grad=True)  # puts every layer's node in the graph
        self._accumulate: List[bool] = [False] * len(layers)
        self._recording = False

    # -- the stack's calls, with the caller's stream on CUDA --------------------------

    def _stream(self) -> int:
        return torch.cuda.current_stream(self.device).cuda_stream

    def _acquire(self, i: int) -> torch.Tensor:
        return self._core.acquire(i, self._stream()) if self.device.type == "cuda" else self._core.acquire(i)

    def _release(self, i: int) -> None:
        if self.device.type == "cuda":
            self._core.release(i, self._stream())
        else:
            self._core.release(i)

    def _reset(self) -> None:
        if self.device.type == "cuda":
            self._core.reset(self._stream())
        else:
            self._core.reset()

    def _push(self, i: int, accumulate: bool) -> None:
        if self.device.type == "cuda":
            self._core.push(i, accumulate, self._stream())
        else:
            self._core.push(i, accumulate)

    # -- the passes ------------------------------------------------------------------

    def forward(self, x: torch.Tensor, *args: Any) -> torch.Tensor:
        """Runs every layer in order: ``x = layer(x, *args)``. ``args`` go to every layer
        unchanged and get no gradient (a tensor among them that requires one is refused)."""
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"StreamedLayers takes a tensor as its first input, not {type(x).__name__}")
        if x.device != self.device and not (x.device.type == self.device.type == "cpu"):
            raise ValueError(f"StreamedLayers: the input is on {x.device}; the stack's slots are on {self.device}")
        for a in args:
            if isinstance(a, torch.Tensor) and a.requires_grad and torch.is_grad_enabled():
                raise ValueError(
                    "StreamedLayers: an extra input requires grad; extra inputs get no gradient (pass what needs "
                    "one as the first input)"
                )
        with self._pass_lock:
            if self._core.in_pass:
                raise RuntimeError(
                    "StreamedLayers: a pass over the stack is in progress (a forward inside a layer, a backward "
                    "pass not finished, or another thread's pass); one pass at a time"
                )
            self._sync_weights()
            self._recording = torch.is_grad_enabled()  # Function.forward runs with grad off
            self._core.begin_pass(True)
        try:
            for i, lay in enumerate(self._layouts):
                x = _Layer.apply(self, i, len(args), self._token, x, *args, *lay.params)
        except BaseException:
            self._reset()
            raise
        if not self._recording or self._nvme:
            # No backward pass follows: the host may write the weight slabs next (an
            # optimizer, load_state_dict), so the loads that read them must have landed.
            # From NVMe, always: a read that failed after its layer's acquire (which then
            # ran from a slot the read did not fill) is thrown here, so the pass fails.
            self._core.wait_loads()
        return x

    def _capture_state(self, i: int, extra: Tuple[Any, ...]) -> Optional[Dict[str, Any]]:
        """What the recompute of layer i must see as the forward saw it: the RNG state and
        autocast, the modules' training flags, and the versions of the weights and extra
        inputs (an in-place change before the backward pass is refused, as autograd does)."""
        if not self._recording:
            return None
        layer = self.layers[i]
        cuda = self.device.type == "cuda"
        kind = self.device.type
        return {
            "rng": torch.get_rng_state() if self.preserve_rng_state else None,
            "cuda_rng": torch.cuda.get_rng_state(self.device) if self.preserve_rng_state and cuda else None,
            "autocast": (torch.is_autocast_enabled(kind), torch.get_autocast_dtype(kind)),
            "training": [m.training for m in layer.modules()],
            "versions": [p._version for p in self._layouts[i].params],
            "written": self._written[i],
            "extra": [(a, a._version) for a in extra if isinstance(a, torch.Tensor)],
        }

    def _call(self, i: int, slot: torch.Tensor, x: torch.Tensor, extra: Tuple[Any, ...]) -> Tuple[torch.Tensor, List[torch.Tensor]]:
        """Layer i over its slot, with grad recorded as the caller's pass does (so a module
        picks the kernels it picks when it trains: the forward and the recompute run the
        same ones); the weights' tensors are leaves needing grad as the parameters do."""
        lay = self._layouts[i]
        leaves = [v.detach().requires_grad_(p.requires_grad) for v, p in zip(lay.views(slot), lay.params)]
        self._inside += 1
        try:
            out = torch.func.functional_call(self.layers[i], dict(zip(lay.names, leaves)), (x,) + tuple(extra))
        finally:
            self._inside -= 1
        if not isinstance(out, torch.Tensor):
            raise TypeError(f"StreamedLayers: layer {i} returned a {type(out).__name__}, not one tensor")
        return out, leaves

    def _run_forward(self, i: int, x: torch.Tensor, extra: Tuple[Any, ...]) -> torch.Tensor:
        slot = self._acquire(i)
        try:
            # What the layer saves is dropped with its graph at once (only its input is
            # kept, by the stack's node): no hook of the caller's sees it.
            with torch.autograd.graph.saved_tensors_hooks(_same, _same), torch.set_grad_enabled(self._recording):
                out, _ = self._call(i, slot, x.detach(), extra)
            out = out.detach()
            if _in(out, slot):
                out = out.clone()  # a view of the slot (a weight returned as is): it is reused next
        finally:
            del slot
        self._release(i)
        return out

    def _run_backward(self, i: int, x: torch.Tensor, extra: Tuple[Any, ...], state: Optional[Dict[str, Any]],
                      grad: torch.Tensor, x_needs_grad: bool,
                      below: Any = None) -> Tuple[Optional[torch.Tensor], List[Optional[torch.Tensor]]]:
        last = len(self.layers) - 1
        core = self._core
        lay = self._layouts[i]
        refused = False
        try:
            if torch.is_grad_enabled():
                raise RuntimeError(
                    "StreamedLayers: a backward pass with create_graph=True (a gradient of a gradient) is not "
                    "supported: the layers are recomputed and their weights' gradients leave the graph"
                )
            if state is None:
                raise RuntimeError("StreamedLayers: the forward pass ran without grad; there is nothing to differentiate")
            self._check_versions(i, state)
            mode, want = self._gradient_mode(lay)
            if self._frozen and mode != "none":
                raise RuntimeError(
                    f"StreamedLayers: a weight of layer {i} requires grad since the forward pass; the weights on "
                    "NVMe of a stack made with every weight frozen are frozen (they get no gradient: stream the "
                    "layers with their trainable weights requiring grad)"
                )
            if self._nvme and mode == "return":
                if self._hooked(lay):
                    raise RuntimeError(
                        f"StreamedLayers: a weight of layer {i} has a hook (register_hook, "
                        "register_post_accumulate_grad_hook); the gradients of weights on NVMe stay in the stack's "
                        "host slabs and never reach autograd, so no hook would run: remove the hook"
                    )
                # torch.autograd.grad: a meta parameter takes no gradient from the stack (they
                # stay out; the inputs get theirs)
                mode = "none"
            if i == last:
                with self._pass_lock:
                    if core.in_pass:
                        refused = True  # the pass in progress is not this backward's: left as it is
                        raise RuntimeError(
                            "StreamedLayers: a backward pass began while another pass is in progress (the stack "
                            "used twice in one graph, and autograd interleaved the uses? or another thread's pass); "
                            "each use's backward runs the stack once, layer by layer; one pass at a time"
                        )
                    self._got = [[False] * len(l.params) for l in self._layouts]
                    self._prepare_gradients()
                    core.begin_pass(False)
            slot = self._acquire(i)
            xin = x.detach().requires_grad_(x_needs_grad)
            modules = list(self.layers[i].modules())
            was = [m.training for m in modules]
            cuda = self.device.type == "cuda"
            rng = (torch.random.fork_rng(devices=[self.device] if cuda else [])
                   if state["rng"] is not None else contextlib.nullcontext())
            try:
                for m, t in zip(modules, state["training"]):
                    m.training = t
                with rng, torch.enable_grad(), torch.autocast(self.device.type, enabled=state["autocast"][0],
                                                               dtype=state["autocast"][1]):
                    if state["rng"] is not None:
                        torch.set_rng_state(state["rng"])
                    if state.get("cuda_rng") is not None:
                        torch.cuda.set_rng_state(state["cuda_rng"], self.device)
                    out, leaves = self._call(i, slot, xin, extra)
            finally:
                for m, t in zip(modules, was):
                    m.training = t
            trainable = [k for k, v in enumerate(leaves) if v.requires_grad]
            wrt = ([xin] if x_needs_grad else []) + [leaves[k] for k in trainable]
            grads: List[Optional[torch.Tensor]] = [None] * len(wrt)
            if wrt and out.requires_grad:
                grads = list(torch.autograd.grad(out, wrt, grad, allow_unused=True))
            del out
            gx = grads.pop(0) if x_needs_grad else None
            if gx is not None and _in(gx, slot):
                gx = gx.clone()
            gparams: List[Optional[torch.Tensor]] = [None] * len(leaves)
            if mode == "push":
                staging = lay.views(core.staging(i))
                it = iter(grads)
                with torch.no_grad():
                    for k, dst in enumerate(staging):
                        g = next(it) if k in trainable else None
                        if g is not None and want[k]:
                            dst.copy_(g)
                            self._got[i][k] = True
                        else:
                            dst.fill_(-0.0)  # x + -0.0 == x, bit for bit: a gradient it adds to is unchanged
                del staging
                self._push(i, self._accumulate[i])
            elif mode == "return":
                for k, g in zip(trainable, grads):
                    if g is not None and g.device != lay.params[k].device:
                        g = g.to(lay.params[k].device)  # the parameter lives in its pinned slab
                    gparams[k] = None if g is None else g.clone() if _in(g, slot) else g
            del leaves, slot
            self._release(i)
            if i == 0 or not self._engine_goes_below(below):
                # The pass ends here: with layer 0, or above it when autograd stops (the
                # gradients asked for, ``backward(inputs=...)``, are all above).
                if self._nvme:
                    core.wait_loads()  # a failed read fails the pass (see forward)
                core.wait_gradients()
                self._assign_gradients()
                if i != 0:
                    self._reset()
            return gx, gparams
        except BaseException:
            if not refused:
                self._reset()
            raise

    @staticmethod
    def _engine_goes_below(below: Any) -> bool:
        """Whether autograd will run the node of the layer below (``below``)."""
        if below is None:
            return False
        try:
            return bool(torch._C._will_engine_execute_node(below))
        except RuntimeError:  # not asked inside a backward pass: assume it does
            return True

    def _gradient_mode(self, lay: "_Layout") -> Tuple[str, List[bool]]:
        """How the weights' gradients leave, and which weights want one: "push" when
        autograd's backward would accumulate them into ``.grad`` (ferry's gradient path;
        only the weights whose accumulator the engine runs, as ``backward(inputs=...)``
        picks them), "return" under ``torch.autograd.grad`` or for a layer with hooked
        weights (autograd takes them), "none" when nothing wants them."""
        with torch.enable_grad():  # a view of a leaf names its accumulator only with grad on
            nodes = [p.view_as(p).grad_fn.next_functions[0][0] if p.requires_grad else None for p in lay.params]
        try:
            want = [n is not None and bool(torch._C._will_engine_execute_node(n)) for n in nodes]
        except RuntimeError:  # "... currently running autograd.grad()"
            return "return", [p.requires_grad for p in lay.params]
        if not any(want):
            return "none", want
        # A weight with hooks (register_hook, register_post_accumulate_grad_hook) gets its
        # gradient from autograd, which runs them with it as plain torch does.
        return ("return" if self._hooked(lay) else "push"), want

    @staticmethod
    def _hooked(lay: "_Layout") -> bool:
        """Whether a weight of the layer has a gradient hook of autograd's."""
        return any(getattr(p, "_backward_hooks", None) or getattr(p, "_post_accumulate_grad_hooks", None)
                   for p in lay.params)

    def _check_versions(self, i: int, state: Dict[str, Any]) -> None:
        lay = self._layouts[i]
        if state["written"] != self._written[i]:
            raise RuntimeError(
                "one of the variables needed for gradient computation has been modified by an inplace operation: "
                f"[StreamedLayers: the weights of layer {i} were written into {self._nvme_path!r} "
                f"({self._written[i] - state['written']} time(s): load_state_dict, a replaced parameter, an "
                "optimizer step) since the forward pass; the backward pass recomputes the layer from its weights]"
            )
        for name, p, v in zip(lay.names, lay.params, state["versions"]):
            if p._version != v:
                raise RuntimeError(
                    "one of the variables needed for gradient computation has been modified by an inplace operation: "
                    f"[StreamedLayers: weight {name!r} of layer {i} was at version {v} in the forward pass and is now "
                    f"at version {p._version}; the backward pass recomputes the layer from its weights]"
                )
        for a, v in state["extra"]:
            if a._version != v:
                raise RuntimeError(
                    "one of the variables needed for gradient computation has been modified by an inplace operation: "
                    f"[StreamedLayers: an extra input of shape {tuple(a.shape)} was at version {v} in the forward "
                    f"pass and is now at version {a._version}]"
                )

    def _prepare_gradients(self) -> None:
        """Before a backward pass: per layer, add into the gradient slab when every
        trainable parameter's ``.grad`` is its view there, overwrite it when none has a
        ``.grad``; otherwise fill with -0.0 (x + -0.0 == x, bit for bit) what has none or
        another tensor, and add."""
        if self._frozen:
            return  # no gradient slabs
        if self._nvme:
            self._prepare_slab_gradients()
            return
        with torch.no_grad():
            for i, lay in enumerate(self._layouts):
                for p, g in zip(lay.params, self._grads[i]):
                    if not p.requires_grad and p.grad is not None and p.grad.data_ptr() == g.data_ptr():
                        p.grad = p.grad.clone()  # a weight frozen since: its .grad no longer the slab's
                mine = [p.grad is not None and p.grad.data_ptr() == g.data_ptr() and p.grad.shape == g.shape
                        for p, g in zip(lay.params, self._grads[i])]
                trainable = [p.requires_grad for p in lay.params]
                if all(m for m, t in zip(mine, trainable) if t):
                    self._accumulate[i] = True
                elif all(p.grad is None for p, t in zip(lay.params, trainable) if t):
                    self._accumulate[i] = False
                else:
                    for p, g, m in zip(lay.params, self._grads[i], mine):
                        if not m:
                            g.fill_(-0.0)
                    self._accumulate[i] = True

    def _prepare_slab_gradients(self) -> None:
        """``_prepare_gradients`` with the weights on NVMe, where a parameter's ``.grad`` is
        its ``SlabGradient`` (the gradient slab has it) or not: per layer, add into the slab
        when every trainable parameter's ``.grad`` is its own, overwrite it when no
        parameter's is (a frozen one's kept too); otherwise fill with -0.0 the gradients of
        the others, and add. A ``.grad`` of any other kind (a ``meta`` tensor has no values)
        counts as none."""
        with torch.no_grad():
            for i, lay in enumerate(self._layouts):
                mine = [p.grad is not None and p.grad is m for p, m in zip(lay.params, self._markers[i])]
                trainable = [p.requires_grad for p in lay.params]
                if all(m for m, t in zip(mine, trainable) if t):
                    self._accumulate[i] = True
                elif not any(mine):
                    self._accumulate[i] = False
                else:
                    for g, m in zip(self._grads[i], mine):
                        if not m:
                            g.fill_(-0.0)
                    self._accumulate[i] = True

    def _assign_gradients(self) -> None:
        """After a backward pass: each weight that got a gradient in it has ``.grad`` its
        view of the gradient slab (or a ``.grad`` of the caller's own gets it added); with
        the weights on NVMe, its ``SlabGradient``."""
        self._backwards += 1
        if self._nvme:
            for i, (lay, got) in enumerate(zip(self._layouts, self._got)):
                for k, (name, p, have) in enumerate(zip(lay.names, lay.params, got)):
                    if have:
                        m = self._markers[i][k]
                        if m is None:
                            m = self._markers[i][k] = SlabGradient.make(
                                p, self._grads[i][k], f"parameter {name!r} of layer {i}", self, i, k)
                        p.grad = m
            return
        with torch.no_grad():
            for lay, grads, got in zip(self._layouts, self._grads, self._got):
                for p, g, have in zip(lay.params, grads, got):
                    if not have:
                        continue
                    if p.grad is None:
                        p.grad = g
                    elif p.grad.data_ptr() != g.data_ptr():
                        p.grad.add_(g)  # a .grad of the caller's own: added to, as autograd does

    def _sync_weights(self) -> None:
        """Before a forward pass: a parameter replaced since the last (a new
        ``nn.Parameter``, ``p.data = ...``, ``load_state_dict(assign=True)``) has its values
        copied into its place in the slab and becomes a view of it again (weights on NVMe:
        see ``_sync_file``)."""
        if self._nvme:
            self._sync_file()
            return
        with torch.no_grad():
            for i, (layer, lay) in enumerate(zip(self.layers, self._layouts)):
                now = _params_of(layer, lay, i)
                views = None
                for k, (name, old) in enumerate(zip(lay.names, lay.params)):
                    p = now[name]
                    if p is old and p.data_ptr() == self._weight_ptr[i][k]:
                        continue
                    if p.shape != old.shape or p.dtype != old.dtype:
                        raise RuntimeError(
                            f"StreamedLayers: parameter {name!r} of layer {i} was replaced by one of shape "
                            f"{tuple(p.shape)} and dtype {p.dtype} (streamed: {tuple(old.shape)}, {old.dtype})"
                        )
                    if views is None:
                        self._core.wait_loads()  # no load still reads the slab written here
                        views = lay.views(self._core.weights(i))
                    views[k].copy_(p)
                    p.data = views[k]
                    lay.params[k] = p
                    self._weight_ptr[i][k] = p.data_ptr()

    # -- weights on NVMe ---------------------------------------------------------------

    def _sync_file(self) -> None:
        """Before a forward pass with the weights on NVMe, per layer: its parameters are
        named as they were, frozen, each of one layer, not changed in place (a ``meta``
        tensor keeps no values: the change would be lost) and all given (none left without
        values since ``stream_layers``). A parameter replaced by one with values (a new
        ``nn.Parameter``) has them written into the file and becomes a ``meta`` tensor; one
        replaced by a ``meta`` tensor (no values to write) is refused."""
        owner: Dict[int, Tuple[int, str]] = {}
        self._flush_pending()
        with torch.no_grad():
            for i, (layer, lay) in enumerate(zip(self.layers, self._layouts)):
                now = _params_of(layer, lay, i)
                if self._core.lost(i):
                    raise RuntimeError(
                        f"StreamedLayers: layer {i}'s weights in {self._nvme_path!r} were lost (a write failed, and "
                        "so did writing the old ones back); load a state_dict with the layer's weights to go on"
                    )
                fresh = []
                for k, (name, old) in enumerate(zip(lay.names, lay.params)):
                    p = now[name]
                    if id(p) in owner:
                        j, other = owner[id(p)]
                        raise RuntimeError(
                            f"StreamedLayers: parameter {name!r} of layer {i} is also {other!r} of layer {j}; a "
                            "streamed weight belongs to one layer (tie weights outside the stack)"
                        )
                    owner[id(p)] = (i, name)
                    if p.requires_grad and self._frozen:
                        raise RuntimeError(
                            f"StreamedLayers: parameter {name!r} of layer {i} requires grad; the stack's weights on "
                            "NVMe are frozen (it was made with every weight frozen, so it has no gradient slabs): "
                            "p.requires_grad_(False), or stream the layers with their trainable weights requiring grad"
                        )
                    if p is old:
                        if p._version != self._versions[i][k]:
                            raise RuntimeError(
                                f"StreamedLayers: parameter {name!r} of layer {i} was changed in place (a meta tensor: "
                                f"its values are in {self._nvme_path!r}, and the change went nowhere); write weights "
                                "with load_state_dict, or assign a new nn.Parameter with the values"
                            )
                        continue
                    if p.shape != old.shape or p.dtype != old.dtype:
                        raise RuntimeError(
                            f"StreamedLayers: parameter {name!r} of layer {i} was replaced by one of shape "
                            f"{tuple(p.shape)} and dtype {p.dtype} (streamed: {tuple(old.shape)}, {old.dtype})"
                        )
                    if p.is_meta:
                        raise RuntimeError(
                            f"StreamedLayers: parameter {name!r} of layer {i} was replaced by a meta tensor, which has "
                            "no values to write; assign an nn.Parameter with values, or load_state_dict"
                        )
                    fresh.append(k)
                if fresh:
                    self._take(i, lay, [(k, now[lay.names[k]]) for k in fresh])
                if self._unset[i]:
                    missing = [lay.names[k] for k in sorted(self._unset[i])]
                    raise RuntimeError(
                        f"StreamedLayers: layer {i}'s weights {missing} were never given (meta tensors at "
                        "stream_layers); load_state_dict them first"
                    )

    def _take(self, i: int, lay: "_Layout", fresh: List[Tuple[int, torch.nn.Parameter]]) -> None:
        """Layer i's replaced parameters: the values of those that have some written into
        the file, every one of them made (or kept) a ``meta`` tensor and the layer's own;
        all or none (a failed write gives the parameters their values back)."""
        valued = [(k, p) for k, p in fresh if not p.is_meta]
        if valued:
            raw = self._read_layer(i)
            views = lay.views(raw)
            for k, p in valued:
                views[k].copy_(p)
            done = _to_meta([(i, lay.names[k], p) for k, p in valued], "StreamedLayers (a replaced parameter)")
            try:
                self._written[i] += 1
                self._core.write_weights(i, raw)
            except BaseException:
                _swap_back(done)
                raise
            self._pending.pop(i, None)
        for k, p in fresh:
            old = lay.params[k]
            lay.params[k] = p
            self._versions[i][k] = p._version
            self._unset[i].discard(k)
            p._ferry_stack = StackRef(self)
            old._ferry_stack = StackRef()  # out of the stack: stepped no more through it
            if not self._frozen:
                if old.grad is not None and old.grad is self._markers[i][k]:
                    old.grad = None  # its gradient was the slab's place, the new parameter's now
                self._markers[i][k] = None

    def _read_layer(self, i: int) -> torch.Tensor:
        """Layer i's bytes, read from the file into a new CPU tensor (a copy of its new
        weights when their write failed: see ``_write_stepped``)."""
        pending = self._pending.get(i)
        if pending is not None:
            return pending.clone()
        raw = torch.empty(self._core.layer_bytes(i), dtype=torch.uint8)
        self._core.read_weights(i, raw)
        return raw

    def _write_stepped(self, i: int, raw: torch.Tensor, old: Optional[torch.Tensor] = None) -> None:
        """An optimizer's step of layer i (weights on NVMe): its new bytes ``raw`` into the
        file. When the write fails (the file keeps the old bytes, or the layer is lost),
        ``raw`` is kept in host memory and the error raised: the layer's reads see it, and
        the next forward pass, optimizer step or ``flush()`` writes it (nothing of the step
        is lost). ``old``: the bytes the file holds for the layer (``_slab_step`` read them;
        None: the write reads them first, for its rollback)."""
        self._written[i] += 1  # the backward pass of a forward before it is refused, as autograd does
        self._pending[i] = raw
        self._core.write_weights(i, raw, old)
        del self._pending[i]

    def _flush_pending(self) -> None:
        """Writes the stepped weights of the layers whose write failed (``_write_stepped``),
        in order; the first failure raises, the rest kept."""
        for i in sorted(self._pending):
            self._core.write_weights(i, self._pending[i])
            del self._pending[i]

    def flush(self) -> None:
        """With the weights on NVMe: writes the weights an optimizer step left in host
        memory because their write failed (a full disk, an I/O error), so that the file
        holds every layer's; a forward pass and the next optimizer step do it first too.

        :raises OSError: the write failed again (the weights stay in host memory)
        """
        with self._pass_lock:
            if self._core.in_pass:
                raise RuntimeError("StreamedLayers.flush: a pass over the stack is in progress")
            self._flush_pending()

    def _slab_step(self, i: int) -> Tuple[torch.Tensor, torch.Tensor, List[torch.Tensor], List[torch.Tensor]]:
        """For an optimizer's step of layer i (trainable weights on NVMe; the caller holds the
        pass lock from here to ``_write_stepped``, so no pass begins between): the layer's bytes
        read into a new CPU tensor, a copy of them (what the file holds: the rollback of the
        write, which then need not read them again), its parameters' views of the bytes and
        their gradients' (views of the gradient slab). Written back by ``_write_stepped``."""
        if self._core.in_pass:
            raise RuntimeError(
                "OffloadAdamW.step: a pass over the StreamedLayers is in progress; its weights on NVMe are stepped "
                "between passes (after the backward pass)"
            )
        if self._core.lost(i) and i not in self._pending:
            raise RuntimeError(
                f"OffloadAdamW.step: layer {i}'s weights in {self._nvme_path!r} were lost (a write failed, and so did "
                "writing the old ones back); load a state_dict with the layer's weights to go on"
            )
        self._flush_pending()  # a step's weights whose write failed before: the file first
        raw = self._read_layer(i)
        return raw, raw.clone(), self._layouts[i].views(raw), self._grads[i]

    def read_weights(self, i: int) -> Dict[str, torch.Tensor]:
        """Layer i's weights as new CPU tensors, by parameter name: from the pinned slab (a
        copy), or read from the file with the weights on NVMe (where the parameters are
        ``meta`` tensors, without values; one never given stays a ``meta`` tensor here)."""
        i = whole("read_weights: the layer", i)
        if i >= len(self._layouts):
            raise IndexError(f"StreamedLayers.read_weights: no layer {i} (the stack has {len(self._layouts)})")
        lay = self._layouts[i]
        if self._nvme:
            views = lay.views(self._read_layer(i))
            return {name: (p.detach() if k in self._unset[i] else v)
                    for k, (name, p, v) in enumerate(zip(lay.names, lay.params, views))}
        return {name: p.detach().clone() for name, p in zip(lay.names, lay.params)}

    @staticmethod
    def _outside_call(stack_ref: Any, module: torch.nn.Module, args: Any) -> None:
        """A streamed layer's forward pre-hook, with the weights on NVMe: its parameters
        are meta tensors, so a call from outside the stack is refused (torch may compute
        with a meta weight and return uninitialised memory rather than raise)."""
        stack = stack_ref()
        if stack is not None and stack._inside == 0:
            raise RuntimeError(
                f"a layer of a StreamedLayers with its weights on NVMe ({stack._nvme_path!r}) was called on its own; "
                "its parameters are meta tensors (the values are in the file): call the stack, or read the "
                "weights with state_dict() / read_weights(i)"
            )

    @staticmethod
    def _state_dict_from_file(module: "StreamedLayers", state_dict: Dict[str, Any], prefix: str,
                              local_metadata: Any) -> None:
        """state_dict's post hook with the weights on NVMe: each streamed parameter's entry
        (a ``meta`` tensor, or the parameter itself with ``keep_vars=True``) becomes its
        values, read from the file (one read per layer); one never given stays a ``meta``
        tensor."""
        for i, lay in enumerate(module._layouts):
            keys = [f"{prefix}layers.{i}.{name}" for name in lay.names]
            wanted = [k for n, k in enumerate(keys)
                      if n not in module._unset[i] and getattr(state_dict.get(k), "is_meta", False)]
            if not wanted:
                continue
            for k, v in zip(keys, lay.views(module._read_layer(i))):
                if k in wanted:
                    state_dict[k] = v

    @staticmethod
    def _load_into_file(module: "StreamedLayers", state_dict: Dict[str, Any], prefix: str, local_metadata: Any,
                        strict: bool, missing_keys: List[str], unexpected_keys: List[str],
                        error_msgs: List[str]) -> None:
        """load_state_dict's pre hook with the weights on NVMe: the given values of each
        layer's streamed parameters are written into the file, layer by layer (one read and
        one write each, cast to the parameter's dtype as torch's load casts; a failed write
        puts the layer's old bytes back, and the error names the layers written before it),
        and their entries leave torch's load (which would copy into, or assign, ``meta``
        tensors: the parameters stay as they are); ``_after_load`` takes their keys out of
        the missing ones. An entry of another shape is left to torch's load, which reports
        it. Under the stack's pass lock: no pass begins while the file is written."""
        handled: List[str] = []
        module._handled[threading.get_ident()] = handled  # this load's (a failed one's are dropped)
        written: List[int] = []
        with module._pass_lock, torch.no_grad():
            if module._core.in_pass:
                raise RuntimeError(
                    "StreamedLayers.load_state_dict: a pass over the stack is in progress; the weights on NVMe are "
                    "written between passes"
                )
            for i, lay in enumerate(module._layouts):
                given = []
                for k, (name, p) in enumerate(zip(lay.names, lay.params)):
                    key = f"{prefix}layers.{i}.{name}"
                    v = state_dict.get(key)
                    if isinstance(v, torch.Tensor) and not v.is_meta and v.shape == p.shape:
                        given.append((k, key, v))
                if not given:
                    continue
                if module._core.lost(i) and i not in module._pending:
                    # Its bytes in the file are undefined: only the whole layer is written.
                    if len(given) != len(lay.names):
                        missing = sorted(set(lay.names) - {lay.names[k] for k, _, _ in given})
                        raise RuntimeError(
                            f"StreamedLayers.load_state_dict: layer {i}'s weights in {module._nvme_path!r} were lost "
                            f"(a write failed, and so did writing the old ones back); the state_dict must give all "
                            f"of them ({missing} missing)"
                        )
                    raw = torch.zeros(module._core.layer_bytes(i), dtype=torch.uint8)
                else:
                    raw = module._read_layer(i)
                views = lay.views(raw)
                for k, _, v in given:
                    views[k].copy_(v)
                module._written[i] += 1  # before: a failed write may have changed the file too
                try:
                    module._core.write_weights(i, raw)
                except OSError as e:
                    raise OSError(
                        e.errno,
                        f"{e.strerror}; StreamedLayers.load_state_dict: layers {written} hold the loaded weights, "
                        f"layer {i} and those after it their own",
                    ) from e
                written.append(i)
                module._pending.pop(i, None)  # the file has the layer now (a step's weights, loaded over)
                for k, key, _ in given:
                    del state_dict[key]
                    handled.append(key)
                    module._unset[i].discard(k)
                    module._versions[i][k] = lay.params[k]._version  # an in-place no-op before: overwritten

    @staticmethod
    def _after_load(module: "StreamedLayers", incompatible_keys: Any) -> None:
        """load_state_dict's post hook with the weights on NVMe: the keys the pre hook
        wrote into the file (and took out of torch's load) are not missing."""
        handled = set(module._handled.pop(threading.get_ident(), []))
        if handled:
            incompatible_keys.missing_keys[:] = [k for k in incompatible_keys.missing_keys if k not in handled]

    def _close(self) -> None:
        """Drops the stack's core now (its file is removed), when ``stream_layers`` fails
        part way."""
        core = getattr(self, "_core", None)
        if core is not None:
            self._core = None
            del core

    # -- the rest ---------------------------------------------------------------------

    def _apply(self, fn: Any, recurse: bool = True) -> "StreamedLayers":
        # The weights stay in their pinned slabs whatever device the model moves to (they
        # are streamed from there); a change of dtype would need new slabs: refused.
        for lay in self._layouts:
            for name, p in zip(lay.names, lay.params):
                probe = fn(torch.empty(0, dtype=p.dtype))
                if probe.dtype != p.dtype:
                    raise RuntimeError(
                        f"StreamedLayers: its weights keep their dtype ({name!r} is {p.dtype}, the call makes "
                        f"{probe.dtype}); convert the layers before stream_layers"
                    )
        for layer in self.layers:
            for m in layer.modules():
                for key, b in list(m._buffers.items()):
                    if b is not None:
                        m._buffers[key] = fn(b)
        return self

    def __iter__(self) -> Any:
        raise TypeError(
            "StreamedLayers runs its layers itself (each from its slot): call it, x = stack(x, *args), instead of "
            "iterating over it (its layers are in .layers, for reading)"
        )

    def __len__(self) -> int:
        return len(self.layers)

    def __deepcopy__(self, memo: Dict[int, Any]) -> "StreamedLayers":
        """A stack of its own: the layers copied (weights with their current values, in new
        slabs), the same slots and options; ``.grad`` is not copied. Refused with the
        weights on NVMe (a copy would need a file of its own)."""
        if self._nvme:
            raise TypeError(
                f"a StreamedLayers with its weights on NVMe ({self._nvme_path!r}) cannot be deep-copied (its "
                "weights are in its file): stream a copy of the layers, with their state_dict() loaded, to a new path"
            )
        layers = [copy.deepcopy(layer, memo) for layer in self.layers]
        for layer in layers:
            for p in layer.parameters():
                p.grad = None
        return StreamedLayers(layers, slots=self._core.slots, gradient_slabs=self._gradient_slabs,
                              preserve_rng_state=self.preserve_rng_state, device=self.device)

    def __reduce_ex__(self, protocol: Any) -> Any:
        where = f"in its file {self._nvme_path!r}" if getattr(self, "_nvme", False) else "in ferry's pinned slabs"
        raise TypeError(
            f"a StreamedLayers cannot be pickled (its weights are {where}): save its state_dict(), and load it into "
            "a new stack (or into the layers as they were)"
        )

    def stats(self) -> Dict[str, int]:
        """The streamer's counters: ``passes``, ``loads``, ``bytes_loaded``, ``acquires``,
        ``releases``, ``pushes``, ``bytes_pushed``, ``landed``, ``pool_waits``,
        ``pinned_bytes`` (weight and gradient slabs), ``slot_bytes`` (the device slots), and
        the weights' file: ``nvme`` (whether the weights are on NVMe), ``file_bytes`` (its
        size), ``direct_io`` (whether it is read with O_DIRECT)."""
        return dict(self._core.stats())

    @property
    def slots(self) -> int:
        """The number of device slots K."""
        return self._core.slots

    def extra_repr(self) -> str:
        return (f"slots={self._core.slots}, device={self.device}, "
                + (f"nvme_path={self._nvme_path!r}, " if self._nvme else "")
                + f"layer_bytes={[self._core.layer_bytes(i) for i in range(len(self.layers))]}")


def _slot_device(device: Any, params: List[torch.Tensor]) -> torch.device:
    """Where the slots go: ``device`` (None: the CUDA device the parameters are on, else
    the CPU), checked against this build and machine."""
    if device is None:
        on = {p.device for p in params if p.device.type != "cpu"}
        if len(on) > 1:
            raise ValueError(f"stream_layers: the parameters are on several devices ({sorted(map(str, on))}); "
                             "pass device=")
        device = next(iter(on)) if on else torch.device("cpu")
    return device_of("stream_layers", device)


def stream_layers(layers: Sequence[torch.nn.Module], *, slots: int = 2, gradient_slabs: int = 4,
                  preserve_rng_state: bool = True, device: Any = None, nvme_path: Any = None) -> StreamedLayers:
    """Streams a stack of layers through ``slots`` device slots (MegaTrain-style layer
    streaming): a module that runs ``x = layer(x, *args)`` for each layer, whose weights
    live in ferry's pinned slabs and are loaded into a slot ahead of use.

    - **Weights.** Each parameter's data becomes a view of its layer's pinned slab (the
      values are copied in): an optimizer over ``model.parameters()`` (``OffloadAdamW``,
      any ``torch.optim`` one) updates them in place, and the next pass loads the update.
    - **Forward.** Layer i is run from its slot and only its input is saved (through
      ``offload_activations`` when that is active): a layer's weights are never held
      by the graph.
    - **Backward.** Layer i is loaded again (last layer first), recomputed from its input
      with the forward's RNG state and autocast, and differentiated; its weights'
      gradient is pushed out to a pinned gradient slab, and each parameter's ``.grad``
      becomes (or is added to) a view of that slab once the pass has ended. Gradients
      are bit for bit those of the same layers run as they are.
    - ``args`` are passed to every layer unchanged and get no gradient. Buffers stay on
      their modules (not streamed).

    :param layers: the stack (a list, ``nn.ModuleList`` or ``nn.Sequential``); each
        layer has parameters of float32, float64, float16 or bfloat16 and shares none
        with another layer, and returns one tensor
    :param slots: device slots K >= 1 (loads run up to K layers ahead; at most one per
        layer is made)
    :param gradient_slabs: pinned slabs of the largest layer's size for gradients in
        flight
    :param preserve_rng_state: recompute with the forward's RNG state (dropout; on CUDA
        the device's generator too)
    :param device: where the slots are: the CPU (through the CPU model of ferry's device
        runtime) or a CUDA device (``ferry._cuda``: slots and staging buffers in its
        memory, loads and gradient pushes ordered against torch's current stream with
        events). None: the CUDA device the parameters are on, else the CPU. Either way the
        weights move into pinned host slabs, so the streamed parameters are CPU tensors
        afterwards (an optimizer steps them on the host: ``OffloadAdamW``), and the
        input must be on ``device``. The host may write the weights (an optimizer step,
        ``load_state_dict``) after a backward pass or a forward pass without grad: the
        stack has waited for the loads that read them then (on CUDA the loads are
        otherwise asynchronous)
    :param nvme_path: the weights on NVMe instead (FlexGen / ZeRO-Infinity's parameter
        tier, for a model larger than host memory too): a new or empty file ferry makes,
        sizes to the layers' bytes (each padded to 4 KiB), locks, reads with O_DIRECT where
        the file system allows it, and removes when the stack goes. Each load is a read
        from the file into a slot through a bounce ring of pinned memory; no pinned memory
        holds the weights. With every streamed parameter's ``requires_grad`` False the
        stack is **frozen** (no gradient slabs: inference, or a frozen stack under
        trainable parts outside it; the input still gets its gradient). With a trainable
        one it keeps a pinned gradient slab per layer (ZeRO-Infinity's split: weights and
        optimizer states on NVMe, gradients in host memory): each trainable parameter's
        ``.grad`` is then a ``SlabGradient`` (a ``meta`` tensor standing for its slab;
        ``.values()`` reads it), clipped by ``ferry.torch.clip_grad_norm_`` and stepped by
        ``OffloadAdamW`` a layer at a time (read from the file, stepped, written back; a
        failed write keeps the new weights in host memory until the next pass, step or
        ``flush()`` writes them). Each parameter becomes a ``meta`` tensor (the same
        object and attributes: shape, dtype, no values; all or none); ``state_dict()``
        reads the values from the file,
        ``load_state_dict`` writes them there (between passes, under the pass lock), a
        parameter replaced by one with values has them written at the next forward pass,
        and ``read_weights(i)`` reads a layer's. In-place changes to the ``meta``
        parameters, a parameter in two layers and a layer called on its own are refused.
        Layers built on the ``meta`` device may be streamed and loaded later
        (``load_state_dict``, from ``torch.load(..., mmap=True)``): a stack larger than
        host memory. The file is removed with the stack, or at exit
    :raises TypeError, ValueError: for layers that cannot be streamed (named), a device
        other than the CPU and CUDA, CUDA without ``ferry._cuda`` or a usable device; with
        ``nvme_path``, a parameter that torch cannot make a ``meta`` tensor in place
        (weakly referenced, saved by a live graph) or that a stack on NVMe streams
        already; without it, a ``meta`` parameter
    :raises FileExistsError: ``nvme_path`` is a file that is not empty
    :raises OSError: the file cannot be made, sized or written (``errno`` the file
        system's), the parameters unchanged
    :raises MemoryError: when the pinned slabs cannot be had
    """
    return StreamedLayers(layers, slots=slots, gradient_slabs=gradient_slabs, preserve_rng_state=preserve_rng_state,
                          device=device, nvme_path=nvme_path)
