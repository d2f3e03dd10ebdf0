"""ferry for Python: the extension (ferry._core) and the PyTorch layer (ferry.torch)."""

from ferry import _core

__all__ = ["has_cuda", "__version__"]

__version__ = "0.1.0"

#: Whether this build of the extension runs on CUDA (False: the CPU model of the device
#: runtime, on CPU tensors).
has_cuda: bool = _core.has_cuda
