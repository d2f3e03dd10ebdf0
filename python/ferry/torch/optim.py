"""``OffloadAdamW``: ``torch.optim.AdamW`` with its states in ferry's pinned pool, stepped by
ferry's vectorised, multi-threaded CPU AdamW (``ferry::basic_adamw``)."""

from __future__ import annotations

import math
import numbers
from typing import Any, Callable, Dict, Iterable, Optional, Tuple

import torch

from ferry import _core
from ferry.torch._checks import whole

__all__ = ["OffloadAdamW"]


def _describe(t: torch.Tensor) -> str:
    return f"shape = {tuple(t.shape)}, dtype = {t.dtype}, device = {t.device}"


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

    This build steps parameters on the CPU (float32, contiguous); gradients may be
    strided (they are read through a contiguous copy then). ``step`` and
    ``load_state_dict`` are all or nothing: every check and allocation comes before any
    change. A copy (``copy.deepcopy``, ``pickle``) gets a pool of its own. Like
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

    Raises:
        ValueError: a hyper-parameter out of range (naming it), ``amsgrad`` or
            ``maximize`` (not supported), a parameter that is not float32, strided,
            contiguous and on the CPU (naming its shape, dtype and device).
        MemoryError: at a ``step`` whose new moments do not fit in the pool (nothing is
            updated; the step can be called again once there is room).
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
    ) -> None:
        if amsgrad or maximize:
            raise ValueError("OffloadAdamW: amsgrad and maximize are not supported (ferry's AdamW has neither)")
        _hyper(lr, betas, eps, weight_decay)
        self._settings = {
            "pinned_bytes": whole("OffloadAdamW: pinned_bytes", pinned_bytes),
            "threads": whole("OffloadAdamW: threads", threads),
            "fused_rounding": bool(fused_rounding),
        }
        defaults = dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay)
        super().__init__(params, defaults)  # each group through add_param_group: checked
        self._make_engine()

    def _make_engine(self) -> None:
        self._pool = _core.StatePool(self._settings["pinned_bytes"])
        self._adamw = _core.AdamW(self._settings["threads"], self._settings["fused_rounding"])

    @property
    def state_bytes(self) -> int:
        """Bytes of the pool the moments hold now."""
        return self._pool.used

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
            _hyper(group["lr"], group["betas"], group["eps"], group["weight_decay"])
            for p in group["params"]:
                _check_param(p)
        except Exception:
            self.param_groups.pop()
            raise

    def _moment(self, p: torch.Tensor) -> torch.Tensor:
        if p.numel() == 0:
            return torch.zeros_like(p)  # nothing to hold
        return self._pool.zeros(p.numel()).view(p.shape)

    @torch.no_grad()
    def step(self, closure: Optional[Callable[[], float]] = None) -> Optional[float]:
        """One AdamW step over every parameter that has a gradient. All or nothing: every
        group and gradient is checked and every missing moment allocated before any
        parameter changes, so an error (``ValueError``, ``MemoryError``) leaves every
        parameter and state as it was, and the step can be called again."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        work = []
        for group in self.param_groups:
            hp = _hyper(group["lr"], group["betas"], group["eps"], group["weight_decay"])
            for p in group["params"]:
                if p.grad is None:
                    continue
                grad = p.grad
                if grad.is_sparse:
                    raise ValueError(f"OffloadAdamW: sparse gradients are not supported [{_describe(p)}]")
                _check_param(p)
                if grad.dtype != p.dtype or grad.device != p.device or grad.shape != p.shape:
                    raise ValueError(
                        f"OffloadAdamW: a gradient unlike its parameter [param: {_describe(p)}; grad: {_describe(grad)}]"
                    )
                work.append((p, hp))
        created = []
        try:
            for p, _ in work:
                if not self.state.get(p):
                    m = self._moment(p)  # MemoryError: the moments made by this call go again
                    v = self._moment(p)
                    self.state[p] = {"step": torch.tensor(0.0), "exp_avg": m, "exp_avg_sq": v}
                    created.append(p)
        except BaseException:
            for p in created:
                del self.state[p]
            raise
        for p, (lr, beta1, beta2, eps, wd) in work:
            state = self.state[p]
            step = int(state["step"].item()) + 1
            if p.numel() > 0:
                grad = p.grad.detach()
                if grad.untyped_storage().data_ptr() == p.untyped_storage().data_ptr():
                    grad = grad.clone()  # a gradient sharing its parameter's memory (p.grad = p.detach())
                self._adamw.step(
                    p.detach().view(-1),
                    grad.contiguous().view(-1),
                    state["exp_avg"].view(-1),
                    state["exp_avg_sq"].view(-1),
                    lr=lr,
                    beta1=beta1,
                    beta2=beta2,
                    eps=eps,
                    weight_decay=wd,
                    step=step,
                )
            state["step"].fill_(float(step))
        return loss

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
        old_state, old_groups = self.state, self.param_groups
        try:
            super().load_state_dict(state_dict)
            moments = {}
            for group in self.param_groups:
                _hyper(group["lr"], group["betas"], group["eps"], group["weight_decay"])
                for p in group["params"]:
                    st = self.state.get(p)
                    if not st:
                        continue
                    fresh = {}
                    for key in ("exp_avg", "exp_avg_sq"):
                        loaded = st[key]
                        if loaded.shape != p.shape:
                            raise ValueError(
                                f"OffloadAdamW.load_state_dict: {key} of shape {tuple(loaded.shape)} for a "
                                f"parameter of shape {tuple(p.shape)}"
                            )
                        fresh[key] = self._moment(p).copy_(loaded.to(dtype=torch.float32, device="cpu"))
                    step = st["step"]
                    fresh["step"] = torch.tensor(float(step.item() if isinstance(step, torch.Tensor) else step))
                    moments[p] = fresh
        except BaseException:
            self.state, self.param_groups = old_state, old_groups
            raise
        for p, fresh in moments.items():
            self.state[p] = fresh

    def __getstate__(self) -> Dict[str, Any]:
        state = super().__getstate__()
        state["_ferry_settings"] = dict(self._settings)
        return state

    def __setstate__(self, state: Dict[str, Any]) -> None:
        """A copy (``copy.deepcopy``, ``pickle``, ``torch.save`` of the optimizer) gets a
        pool of its own, with the moments copied in."""
        self._settings = state.pop(
            "_ferry_settings", {"pinned_bytes": 0, "threads": 0, "fused_rounding": True}
        )
        super().__setstate__(state)
        self._make_engine()
        for p, st in list(self.state.items()):
            for key in ("exp_avg", "exp_avg_sq"):
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
    if p.device.type != "cpu":
        raise ValueError(f"OffloadAdamW: this build steps CPU parameters only [{_describe(p)}]")
    if p.dtype != torch.float32:
        raise ValueError(f"OffloadAdamW: parameters must be float32 (ferry's AdamW is fp32) [{_describe(p)}]")
    if not p.is_contiguous():
        raise ValueError(f"OffloadAdamW: parameters must be contiguous (updated in place) [{_describe(p)}]")
