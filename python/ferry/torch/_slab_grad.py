"""The gradient of a trainable weight on NVMe (``stream_layers(nvme_path=...)``), and the
gradient clipping that reads it (``clip_grad_norm_``).

Such a parameter is a ``meta`` tensor (its values are in the stack's file), and torch
requires a parameter's ``.grad`` to be on the parameter's device: its gradient itself
lives in the stack's gradient slab (host memory: ZeRO-Infinity keeps gradients there, and
parameters and optimizer states on NVMe). Its ``.grad`` is a ``SlabGradient``: a ``meta``
tensor of the parameter's shape and dtype that stands for the slab's values. It says that
the parameter has a gradient (``zero_grad`` sets it to None, and the next backward pass
then overwrites the slab instead of adding into it, as autograd does with ``.grad``),
``zero_()`` zeroes the slab (``zero_grad(set_to_none=False)``), ``values()`` returns the
slab's tensor, and every other torch operation on it raises ``RuntimeError`` naming what to
call instead: an operation on a ``meta`` tensor computes nothing, so torch's own
``clip_grad_norm_`` or ``torch.optim.AdamW`` would otherwise do nothing, silently.
"""

from __future__ import annotations

import weakref
from typing import Any, Iterable, Optional, Union

import torch

__all__ = ["SlabGradient", "clip_grad_norm_"]


class SlabGradient(torch.Tensor):
    """The ``.grad`` of a trainable parameter of a ``StreamedLayers`` with its weights on
    NVMe: a ``meta`` tensor (the parameter's shape, strides and dtype) standing for the
    gradient in the stack's host gradient slab. ``values()`` is that gradient (a CPU
    tensor over the slab: valid until the stack's next backward pass or its end). Only
    shape and dtype queries, ``.data`` (the ``SlabGradient`` itself), ``zero_()`` (zeroes
    the slab) and ``detach_`` /
    ``requires_grad_`` (``zero_grad(set_to_none=False)``) work on it; any other torch
    operation raises ``RuntimeError`` (use ``ferry.torch.clip_grad_norm_`` and
    ``OffloadAdamW``, which read the slab)."""

    _slab: torch.Tensor
    _where: str

    @staticmethod
    def make(param: torch.Tensor, slab: torch.Tensor, where: str, stack: Any, layer: int,
             index: int) -> "SlabGradient":
        """The gradient of ``param`` (a ``meta`` parameter) whose values are ``slab`` (a
        CPU tensor of its shape and dtype); ``where`` names it in errors; ``stack``,
        ``layer``, ``index``: the ``StreamedLayers`` holding it (weakly) and the
        parameter's place there."""
        empty = torch.empty_strided(param.shape, param.stride(), dtype=param.dtype, device="meta")
        g = torch.Tensor._make_subclass(SlabGradient, empty, False)
        g._slab = slab
        g._where = where
        g._stack = weakref.ref(stack)
        g._layer = layer
        g._index = index
        return g

    def values(self) -> torch.Tensor:
        """The gradient's values: a CPU tensor over the stack's gradient slab (the
        parameter's shape, contiguous; its memory is reused by the stack's next backward
        pass)."""
        return self._slab

    def stack(self) -> Any:
        """The ``StreamedLayers`` that holds the gradient (None once it is gone)."""
        return self._stack()

    @classmethod
    def __torch_function__(cls, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        if name in ("zero_", "_foreach_zero_"):
            targets = args[0] if name == "_foreach_zero_" else [args[0]]
            with torch.no_grad():
                for t in targets:
                    if isinstance(t, SlabGradient):
                        t._slab.zero_()
                    else:
                        with torch._C.DisableTorchFunctionSubclass():
                            t.zero_()
            return args[0]
        owner = getattr(func, "__self__", None) if name == "__get__" else None
        if owner is _DATA:
            return args[0]  # p.grad.data: the gradient itself (an old idiom, p.grad.data.zero_(), zeroes the slab)
        if (name == "__get__" and getattr(owner, "__name__", "") not in _VIEWS) or name in _METADATA:
            with torch._C.DisableTorchFunctionSubclass():
                return func(*args, **kwargs)
        where = next((a._where for a in _flat(args) if isinstance(a, SlabGradient)), "a weight on NVMe")
        # RuntimeError, not TypeError: torch turns a TypeError of a binary operator into
        # NotImplemented (and a message of its own)
        raise RuntimeError(
            f"the gradient of {where} is in the stack's host gradient slab (its weights are on NVMe, the parameter "
            f"and its .grad meta tensors): torch's {name or func} would compute nothing with it. Clip with "
            "ferry.torch.clip_grad_norm_, step with ferry.torch.OffloadAdamW, read it with p.grad.values()"
        )

    def __reduce_ex__(self, protocol: Any) -> Any:
        raise TypeError(
            f"a SlabGradient (the gradient of {self._where}) is not copied or pickled: it stands for the stack's "
            "gradient slab; copy or save p.grad.values()"
        )

    def __deepcopy__(self, memo: Any) -> Any:
        self.__reduce_ex__(2)

    def __repr__(self, *args: Any, **kwargs: Any) -> str:
        return f"SlabGradient(shape={tuple(self.shape)}, dtype={self.dtype}, of {self._where})"


_DATA = torch.Tensor.data  # the descriptor, whose __get__ torch passes for ``.data``
# Properties that are views of the values (a meta tensor's: changes to it go nowhere): refused.
_VIEWS = frozenset({"T", "mT", "H", "mH", "real", "imag"})

# Tensor methods that only read metadata (no values): allowed on a SlabGradient.
_METADATA = frozenset({
    "size", "dim", "numel", "nelement", "stride", "element_size", "is_contiguous", "storage_offset",
    "requires_grad_", "detach_", "__format__", "__hash__", "__len__", "_is_view", "is_floating_point",
    "is_complex", "get_device", "__setstate__", "_typed_storage", "untyped_storage",
})


def _flat(args: Any) -> Iterable[Any]:
    for a in args:
        if isinstance(a, (list, tuple)):
            yield from _flat(a)
        else:
            yield a


def clip_grad_norm_(parameters: Union[torch.Tensor, Iterable[torch.Tensor]], max_norm: float,
                    norm_type: float = 2.0, error_if_nonfinite: bool = False,
                    foreach: Optional[bool] = None) -> torch.Tensor:
    """``torch.nn.utils.clip_grad_norm_`` over gradients of any kind: the ``SlabGradient``
    of a trainable weight on NVMe is read from, and scaled in, its host slab; an ordinary
    ``.grad`` (on any device) as torch does. The same arithmetic as torch's, through
    torch's own ``get_total_norm`` and ``clip_grads_with_norm_`` (each slab passed in its
    gradient's place): the total norm is the ``norm_type`` norm of every gradient's norm,
    and each gradient is multiplied by ``min(max_norm / (total + 1e-6), 1)``; a model
    whose gradients are all on the CPU clips bit for bit as torch clips it.

    :param parameters: a tensor or tensors whose ``.grad`` is clipped (those without one
        are skipped)
    :param max_norm: the largest total norm
    :param norm_type: the norm's order (``inf`` for the largest absolute value)
    :param error_if_nonfinite: raise when the total norm is NaN or infinite (nothing is
        scaled then)
    :param foreach: as torch's (the foreach kernels or a loop)
    :returns: the total norm (a 0-dim tensor on the first gradient's device: the CPU for
        a slab)
    :raises RuntimeError: ``error_if_nonfinite`` and a non-finite total norm (torch's)
    """
    if isinstance(parameters, torch.Tensor):
        parameters = [parameters]
    grads = [p.grad for p in parameters if p.grad is not None]
    grads = [g._slab if isinstance(g, SlabGradient) else g for g in grads]
    total = torch.nn.utils.get_total_norm(grads, norm_type, error_if_nonfinite, foreach)
    torch.nn.utils.clip_grads_with_norm_([_Holder(g) for g in grads], max_norm, total, foreach)
    return total


class StackRef:
    """A weak reference to the ``StreamedLayers`` (weights on NVMe) that holds a parameter,
    kept on it as ``p._ferry_stack``: a copy or a pickle of the parameter refers to no
    stack (its values are not in it)."""

    __slots__ = ("_ref",)

    def __init__(self, stack: Any = None) -> None:
        self._ref = None if stack is None else weakref.ref(stack)

    def __call__(self) -> Any:
        return None if self._ref is None else self._ref()

    def __reduce__(self) -> Any:
        return (StackRef, ())

    def __deepcopy__(self, memo: Any) -> "StackRef":
        return StackRef()


class _Holder:
    """A stand-in parameter whose ``.grad`` is ``g`` (torch's clip takes parameters)."""

    __slots__ = ("grad",)

    def __init__(self, g: torch.Tensor) -> None:
        self.grad = g
