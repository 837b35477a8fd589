"""strata: AdamW whose optimizer state lives on a hierarchy of tiers (host memory, NVMe, a
parallel file system), streamed through a bounded host cache and hidden behind computation.

`strata.torch.OffloadedAdamW` is the PyTorch optimizer; `strata.Optimizer` is the native one over
flat fp32 parameters. strata's typed errors are the exception classes below; their text is the
library's message, which names the path, key, subgroup or parameter concerned.
"""

from ._core import (
    BusyError,
    ConfigError,
    CudaError,
    Error,
    ForeignFileError,
    CapacityError,
    IntegrityError,
    IOError,
    Optimizer,
    StreamError,
    __version__,
)

__all__ = [
    "BusyError",
    "CapacityError",
    "ConfigError",
    "CudaError",
    "Error",
    "ForeignFileError",
    "IntegrityError",
    "IOError",
    "Optimizer",
    "StreamError",
    "__version__",
]
