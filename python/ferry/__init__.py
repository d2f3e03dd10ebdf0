"""ferry for Python: the extensions (ferry._core on the CPU model, ferry._cuda on CUDA
where the package was built with the CUDA toolkit) and the PyTorch layer (ferry.torch)."""

from ferry import _core

try:
    from ferry import _cuda
except ImportError:  # a build without the CUDA toolkit: CPU tensors only
    _cuda = None

__all__ = ["has_cuda", "cuda_device_count", "__version__"]

__version__ = "0.1.0"

#: Whether this build has the CUDA module (ferry._cuda: CUDA tensors, on the devices the
#: driver shows). False: CPU tensors only, through the CPU model of the device runtime.
has_cuda: bool = _cuda is not None


def cuda_device_count() -> int:
    """The CUDA devices ferry sees (0 in a build without CUDA, or without a driver or a
    device)."""
    return _cuda.device_count() if _cuda is not None else 0
