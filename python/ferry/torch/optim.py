"""``OffloadAdamW``: ``torch.optim.AdamW`` with its states in ferry's pinned pool, stepped by
ferry's vectorised, multi-threaded CPU AdamW (``ferry::basic_adamw``)."""

from __future__ import annotations

from typing import Any, Callable, Dict, Iterable, Optional, Tuple

import torch

from ferry import _core

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
    strided (they are read through a contiguous copy then).

    Args:
        params: parameters or param groups, as for any ``torch.optim.Optimizer``.
        lr, betas, eps, weight_decay: as ``torch.optim.AdamW`` (same defaults).
        pinned_bytes: the budget of the pool the moments live in (8 bytes per element);
            0: ``FERRY_PINNED_BUDGET_BYTES`` (half of RAM by default).
        threads: CPU threads of the update; 0: ``FERRY_OPTIMIZER_THREADS`` (the hardware
            threads, at most 16).
        fused_rounding: round the moments' multiply-adds as fused (PyTorch's AVX2 /
            AVX-512 kernels) or each operation on its own (its scalar code).

    Raises:
        ValueError: a hyper-parameter out of range (naming it), ``amsgrad`` or
            ``maximize`` (not supported), a parameter that is not float32 on the CPU.
        MemoryError: at the first ``step`` of a parameter whose moments do not fit in the
            pool (nothing of that parameter is updated; the others keep their state).
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
        _check_hyper(lr, betas, eps, weight_decay)
        for name, value in (("pinned_bytes", pinned_bytes), ("threads", threads)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"OffloadAdamW: {name} must be an integer >= 0, not {value!r}")
        defaults = dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay)
        super().__init__(params, defaults)
        for group in self.param_groups:
            _check_hyper(group["lr"], group["betas"], group["eps"], group["weight_decay"])
            for p in group["params"]:
                _check_param(p)
        self._pool = _core.StatePool(pinned_bytes)
        self._adamw = _core.AdamW(threads, bool(fused_rounding))

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

    def _moment(self, p: torch.Tensor) -> torch.Tensor:
        if p.numel() == 0:
            return torch.zeros_like(p)  # nothing to hold
        return self._pool.zeros(p.numel()).view(p.shape)

    @torch.no_grad()
    def step(self, closure: Optional[Callable[[], float]] = None) -> Optional[float]:
        """One AdamW step over every parameter that has a gradient."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            lr, (beta1, beta2), eps, wd = group["lr"], group["betas"], group["eps"], group["weight_decay"]
            _check_hyper(lr, (beta1, beta2), eps, wd)
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
                state = self.state[p]
                if len(state) == 0:
                    m = self._moment(p)  # MemoryError: nothing of this parameter changes
                    v = self._moment(p)
                    state["step"] = torch.tensor(0.0)
                    state["exp_avg"] = m
                    state["exp_avg_sq"] = v
                step = int(state["step"].item()) + 1
                if p.numel() == 0:
                    state["step"].fill_(float(step))
                    continue
                self._adamw.step(
                    p.detach().view(-1),
                    grad.detach().contiguous().view(-1),
                    state["exp_avg"].view(-1),
                    state["exp_avg_sq"].view(-1),
                    lr=float(lr),
                    beta1=float(beta1),
                    beta2=float(beta2),
                    eps=float(eps),
                    weight_decay=float(wd),
                    step=step,
                )
                state["step"].fill_(float(step))
        return loss

    def load_state_dict(self, state_dict: Dict[str, Any]) -> None:
        """As ``torch.optim.Optimizer.load_state_dict``, then each loaded moment is copied
        into the pool (the loaded tensors are not kept), so the optimizer goes on exactly
        where the saved one stopped.

        Raises:
            ValueError: a loaded moment whose shape is not its parameter's (naming both).
        """
        super().load_state_dict(state_dict)
        for group in self.param_groups:
            for p in group["params"]:
                state = self.state.get(p)
                if not state:
                    continue
                for key in ("exp_avg", "exp_avg_sq"):
                    loaded = state[key]
                    if loaded.shape != p.shape:
                        raise ValueError(
                            f"OffloadAdamW.load_state_dict: {key} of shape {tuple(loaded.shape)} for a "
                            f"parameter of shape {tuple(p.shape)}"
                        )
                    moment = self._moment(p)
                    moment.copy_(loaded.to(dtype=torch.float32, device="cpu"))
                    state[key] = moment
                step = state["step"]
                state["step"] = torch.tensor(float(step.item() if isinstance(step, torch.Tensor) else step))


def _check_hyper(lr: Any, betas: Any, eps: Any, weight_decay: Any) -> None:
    if not isinstance(lr, (int, float)) or isinstance(lr, bool) or not 0.0 <= lr < float("inf"):
        raise ValueError(f"OffloadAdamW: invalid learning rate: {lr!r} (a finite number >= 0)")
    if not isinstance(betas, (tuple, list)) or len(betas) != 2:
        raise ValueError(f"OffloadAdamW: betas must be a pair, not {betas!r}")
    for i, b in enumerate(betas):
        if not isinstance(b, (int, float)) or isinstance(b, bool) or not 0.0 <= b < 1.0:
            raise ValueError(f"OffloadAdamW: invalid beta parameter at index {i}: {b!r} (in [0, 1))")
    if not isinstance(eps, (int, float)) or isinstance(eps, bool) or not 0.0 < eps < float("inf"):
        raise ValueError(f"OffloadAdamW: invalid epsilon value: {eps!r} (finite, > 0)")
    if (
        not isinstance(weight_decay, (int, float))
        or isinstance(weight_decay, bool)
        or not 0.0 <= weight_decay < float("inf")
    ):
        raise ValueError(f"OffloadAdamW: invalid weight_decay value: {weight_decay!r} (finite, >= 0)")


def _check_param(p: torch.Tensor) -> None:
    if not isinstance(p, torch.Tensor):
        raise TypeError(f"OffloadAdamW: a parameter must be a torch.Tensor, not {type(p).__name__}")
    if p.device.type != "cpu":
        raise ValueError(f"OffloadAdamW: this build steps CPU parameters only [{_describe(p)}]")
    if p.dtype != torch.float32:
        raise ValueError(f"OffloadAdamW: parameters must be float32 (ferry's AdamW is fp32) [{_describe(p)}]")
    if not p.is_contiguous():
        raise ValueError(f"OffloadAdamW: parameters must be contiguous (updated in place) [{_describe(p)}]")
