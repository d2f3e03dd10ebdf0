"""Layer streaming for PyTorch: ``stream_layers`` (see its docstring)."""

from __future__ import annotations

import contextlib
from typing import Any, Dict, List, Optional, Sequence, Tuple

import torch

from ferry import _core
from ferry.torch._checks import whole

__all__ = ["stream_layers", "StreamedLayers"]

_DTYPES = {torch.float32: "float32", torch.float64: "float64", torch.float16: "float16", torch.bfloat16: "bfloat16"}
_ALIGN = 64  # bytes between parameters in a layer's slab (torch's CPU allocator aligns to 64)


class _Layout:
    """One layer's parameters: name, parameter, offset in bytes, elements, dtype, shape."""

    def __init__(self, layer: torch.nn.Module, index: int) -> None:
        self.names: List[str] = []
        self.params: List[torch.nn.Parameter] = []
        self.offsets: List[int] = []
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
            offset += p.numel() * p.element_size()
        if not self.params:
            raise ValueError(f"stream_layers: layer {index} ({type(layer).__name__}) has no parameters to stream")
        self.bytes = offset

    def spec(self) -> List[Tuple[int, int, str]]:
        return [(o, p.numel(), _DTYPES[p.dtype]) for o, p in zip(self.offsets, self.params)]

    def views(self, raw: torch.Tensor) -> List[torch.Tensor]:
        """The parameters' tensors over a layer's bytes `raw` (a slot, a slab)."""
        out = []
        for o, p in zip(self.offsets, self.params):
            n = p.numel() * p.element_size()
            out.append(raw[o : o + n].view(p.dtype).view(p.shape))
        return out


class _Layer(torch.autograd.Function):
    """Layer i of a stack: forward from its slot without saving anything but its input;
    backward loads it again, recomputes the layer and pushes its weights' gradient out."""

    @staticmethod
    def forward(ctx: Any, owner: "StreamedLayers", index: int, token: torch.Tensor, x: torch.Tensor, *extra: Any) -> torch.Tensor:
        ctx.owner = owner
        ctx.index = index
        ctx.extra = extra
        ctx.state = owner._capture_state()
        ctx.save_for_backward(x)
        return owner._run_forward(index, x, extra)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> Any:
        (x,) = ctx.saved_tensors
        gx = ctx.owner._run_backward(ctx.index, x, ctx.extra, ctx.state, grad, ctx.needs_input_grad[3])
        return (None, None, None, gx) + (None,) * len(ctx.extra)


class StreamedLayers(torch.nn.Module):
    """A stack of layers whose weights live in ferry's pinned slabs and are streamed into
    ``slots`` device slots as the passes need them (made by ``stream_layers``; see there)."""

    def __init__(self, layers: Sequence[torch.nn.Module], slots: int = 2, gradient_slabs: int = 4,
                 preserve_rng_state: bool = True) -> None:
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
        self.layers = torch.nn.ModuleList(layers)
        self.preserve_rng_state = bool(preserve_rng_state)
        self._layouts = [_Layout(layer, i) for i, layer in enumerate(layers)]
        owner: Dict[int, Tuple[int, str]] = {}
        for i, lay in enumerate(self._layouts):
            for name, p in zip(lay.names, lay.params):
                if p.device.type != "cpu":
                    raise ValueError(
                        f"stream_layers: parameter {name!r} of layer {i} is on {p.device}; this build of ferry "
                        "(ferry.has_cuda False) streams CPU tensors"
                    )
                if id(p) in owner:
                    j, other = owner[id(p)]
                    raise ValueError(
                        f"stream_layers: parameter {name!r} of layer {i} is also {other!r} of layer {j}; a streamed "
                        "weight belongs to one layer (tie weights outside the stack)"
                    )
                owner[id(p)] = (i, name)
        self._core = _core.LayerStack([lay.spec() for lay in self._layouts], slots, gradient_slabs)
        # The weights move into the pinned slabs: each parameter's data becomes a view of
        # its slab, so the optimizer, state_dict and load_state_dict work on them in place.
        self._grads: List[List[torch.Tensor]] = []
        with torch.no_grad():
            for i, lay in enumerate(self._layouts):
                for p, w in zip(lay.params, lay.views(self._core.weights(i))):
                    w.copy_(p)
                    p.data = w
                self._grads.append(lay.views(self._core.gradient(i)))
        self._token = torch.zeros((), requires_grad=True)  # puts every layer's node in the graph
        self._accumulate: List[bool] = [False] * len(layers)
        self._recording = False

    # -- the passes ------------------------------------------------------------------

    def forward(self, x: torch.Tensor, *args: Any) -> torch.Tensor:
        """Runs every layer in order: ``x = layer(x, *args)``. ``args`` go to every layer
        unchanged and get no gradient (a tensor among them that requires one is refused)."""
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"StreamedLayers takes a tensor as its first input, not {type(x).__name__}")
        for a in args:
            if isinstance(a, torch.Tensor) and a.requires_grad and torch.is_grad_enabled():
                raise ValueError(
                    "StreamedLayers: an extra input requires grad; extra inputs get no gradient (pass what needs "
                    "one as the first input)"
                )
        if self._core.in_pass:
            raise RuntimeError(
                "StreamedLayers: a pass over the stack is in progress (a forward inside a layer, or a backward "
                "pass not finished); one pass at a time"
            )
        self._recording = torch.is_grad_enabled()  # Function.forward runs with grad off
        self._core.begin_pass(True)
        try:
            for i in range(len(self.layers)):
                x = _Layer.apply(self, i, self._token, x, *args)
        except BaseException:
            self._core.reset()
            raise
        return x

    def _capture_state(self) -> Optional[Tuple[Any, ...]]:
        if not (self.preserve_rng_state and self._recording):
            return None
        return (torch.get_rng_state(), torch.is_autocast_enabled("cpu"), torch.get_autocast_dtype("cpu"))

    def _run_forward(self, i: int, x: torch.Tensor, extra: Tuple[Any, ...]) -> torch.Tensor:
        lay = self._layouts[i]
        slot = self._core.acquire(i)
        try:
            params = dict(zip(lay.names, lay.views(slot)))
            out = torch.func.functional_call(self.layers[i], params, (x,) + tuple(extra))
            if not isinstance(out, torch.Tensor):
                raise TypeError(f"StreamedLayers: layer {i} returned a {type(out).__name__}, not one tensor")
            start = slot.data_ptr()
            if start <= out.untyped_storage().data_ptr() < start + slot.numel():
                out = out.clone()  # a view of the slot (a weight returned as is): it is reused next
        finally:
            del slot
        self._core.release(i)
        return out

    def _run_backward(self, i: int, x: torch.Tensor, extra: Tuple[Any, ...], state: Optional[Tuple[Any, ...]],
                      grad: torch.Tensor, x_needs_grad: bool) -> Optional[torch.Tensor]:
        last = len(self.layers) - 1
        core = self._core
        try:
            if i == last:
                if core.in_pass:
                    raise RuntimeError(
                        "StreamedLayers: a backward pass began while another pass is in progress (the stack used "
                        "twice in one graph?); each graph's backward runs the stack once, layer by layer"
                    )
                self._prepare_gradients()
                core.begin_pass(False)
            lay = self._layouts[i]
            slot = core.acquire(i)
            leaves = [v.detach().requires_grad_(p.requires_grad) for v, p in zip(lay.views(slot), lay.params)]
            xin = x.detach().requires_grad_(x_needs_grad)
            rng = torch.random.fork_rng(devices=[]) if state is not None else contextlib.nullcontext()
            with rng, torch.enable_grad():
                autocast = contextlib.nullcontext()
                if state is not None:
                    torch.set_rng_state(state[0])
                    autocast = torch.autocast("cpu", enabled=state[1], dtype=state[2])
                with autocast:
                    out = torch.func.functional_call(self.layers[i], dict(zip(lay.names, leaves)), (xin,) + tuple(extra))
            wrt = ([xin] if x_needs_grad else []) + [v for v in leaves if v.requires_grad]
            grads = list(torch.autograd.grad(out, wrt, grad, allow_unused=True)) if wrt else []
            del out
            gx = grads.pop(0) if x_needs_grad else None
            staging = lay.views(core.staging(i))
            it = iter(grads)
            with torch.no_grad():
                for v, dst in zip(leaves, staging):
                    if v.requires_grad:
                        g = next(it)
                        if g is not None:
                            dst.copy_(g)
                        else:
                            dst.zero_()  # a weight the layer did not use
                    else:
                        dst.zero_()
            del staging, leaves, slot
            core.push(i, self._accumulate[i])
            core.release(i)
            if i == 0:
                core.wait_gradients()
                self._assign_gradients()
            return gx
        except BaseException:
            core.reset()
            raise

    def _prepare_gradients(self) -> None:
        """Before a backward pass: per layer, add into the gradient slab when every
        trainable parameter's ``.grad`` is its view there, overwrite it when none has a
        ``.grad``; otherwise fill with -0.0 (x + -0.0 == x, bit for bit) what has none or
        another tensor, and add."""
        with torch.no_grad():
            for i, lay in enumerate(self._layouts):
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

    def _assign_gradients(self) -> None:
        with torch.no_grad():
            for lay, grads in zip(self._layouts, self._grads):
                for p, g in zip(lay.params, grads):
                    if not p.requires_grad:
                        continue
                    if p.grad is None:
                        p.grad = g
                    elif p.grad.data_ptr() != g.data_ptr():
                        p.grad.add_(g)  # a .grad of the caller's own: added to, as autograd does

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

    def stats(self) -> Dict[str, int]:
        """The streamer's counters: ``passes``, ``loads``, ``bytes_loaded``, ``acquires``,
        ``releases``, ``pushes``, ``bytes_pushed``, ``landed``, ``pool_waits``, and
        ``pinned_bytes`` (weight and gradient slabs), ``slot_bytes`` (the device slots)."""
        return dict(self._core.stats())

    @property
    def slots(self) -> int:
        """The number of device slots K."""
        return self._core.slots

    def extra_repr(self) -> str:
        return f"slots={self._core.slots}, layer_bytes={[self._core.layer_bytes(i) for i in range(len(self.layers))]}"


def stream_layers(layers: Sequence[torch.nn.Module], *, slots: int = 2, gradient_slabs: int = 4,
                  preserve_rng_state: bool = True) -> StreamedLayers:
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
    :param slots: device slots K >= 1 (loads run up to K layers ahead)
    :param gradient_slabs: pinned slabs of the largest layer's size for gradients in
        flight
    :param preserve_rng_state: recompute with the forward's RNG state (dropout)
    :raises TypeError, ValueError: for layers that cannot be streamed (named)
    :raises MemoryError: when the pinned slabs cannot be had
    """
    return StreamedLayers(layers, slots=slots, gradient_slabs=gradient_slabs, preserve_rng_state=preserve_rng_state)
